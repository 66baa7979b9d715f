//! kvlab-cuda
