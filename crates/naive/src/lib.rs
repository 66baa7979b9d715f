//! kvlab-naive
