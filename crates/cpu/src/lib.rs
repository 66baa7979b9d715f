//! kvlab-cpu
