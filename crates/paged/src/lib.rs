//! kvlab-paged
