//! The vhost-user-fs device (work in progress: see issue 5).
