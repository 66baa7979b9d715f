//! kvlab-cli
