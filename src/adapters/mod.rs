//! Implementations of the ports, one folder per technology.
