//! Host io_uring driver and passthrough filesystem (work in progress: see issue 4).
