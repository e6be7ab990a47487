//! The `shm` provider: a software NIC over shared memory.
