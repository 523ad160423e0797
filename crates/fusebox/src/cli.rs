//! The command line: with no subcommand, fusebox is a vhost-user-fs
//! device with virtiofsd's options; `fusebox mount` serves the host kernel.

use crate::host::MountArgs;
use clap::{Parser, Subcommand, ValueEnum};
use fuse_core::server::faults::{FaultPlan, PlanError};
use passthrough::CachePolicy;
use passthrough::{IdMap, IdMapping};
use std::ffi::OsString;
use std::path::PathBuf;

const QEMU_EXAMPLE: &str = "\
Example (QEMU; guest memory must be shared):
  fusebox --socket-path /tmp/vfs.sock --shared-dir /srv/share &
  qemu-system-x86_64 ... \\
    -chardev socket,id=char0,path=/tmp/vfs.sock \\
    -device vhost-user-fs-pci,chardev=char0,tag=share \\
    -object memory-backend-memfd,id=mem,size=1G,share=on -numa node,memdev=mem
  (in the guest) mount -t virtiofs share /mnt";

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "fusebox",
    version,
    about = "Share a host directory with a VM (vhost-user-fs), or mount it on the host",
    after_help = QEMU_EXAMPLE,
    args_conflicts_with_subcommands = true,
    // As virtiofsd: an option given again overrides itself (`-d -d`,
    // `--cache=auto --cache=never`: the last one wins).
    args_override_self = true
)]
pub struct Cli {
    /// Host mount mode.
    #[command(subcommand)]
    pub cmd: Option<Cmd>,
    /// vhost-user-fs mode (the default).
    #[command(flatten)]
    pub vhost: VhostArgs,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Mount the shared directory on the host through /dev/fuse (root).
    ///
    /// Example: fusebox mount --shared-dir /srv/data /mnt/data
    Mount(MountArgs),
}

/// `--migration-mode` (as virtiofsd's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MigrationMode {
    /// Paths below the shared directory.
    FindPaths,
    /// File handles.
    FileHandles,
}

/// `--migration-on-error` (as virtiofsd's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MigrationOnError {
    /// Fail the migration.
    Abort,
    /// Migrate; EIO on what could not be carried over.
    GuestError,
}

/// Cache policy (as virtiofsd's --cache).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Cache {
    /// No caching in the client.
    Never,
    /// Cache metadata only.
    Metadata,
    /// Cache until a change is seen (close-to-open for data).
    Auto,
    /// Cache everything for long.
    Always,
}

impl Cache {
    /// The passthrough filesystem's policy.
    pub fn policy(self) -> CachePolicy {
        match self {
            Cache::Never => CachePolicy::Never,
            Cache::Metadata => CachePolicy::Metadata,
            Cache::Auto => CachePolicy::Auto,
            Cache::Always => CachePolicy::Always,
        }
    }
}

/// --sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Sandbox {
    /// Mount namespace with pivot_root into the shared directory, new pid
    /// and net namespaces.
    Namespace,
    /// chroot into the shared directory.
    Chroot,
    /// No sandbox.
    None,
}

/// --seccomp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Seccomp {
    /// No filter.
    None,
    /// Kill the process on a syscall outside the allow-list.
    Kill,
    /// Log it.
    Log,
    /// Send SIGSYS.
    Trap,
}

/// --inode-file-handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FileHandles {
    /// Keep an O_PATH fd per inode.
    Never,
    /// Keep file handles (fall back to fds if the filesystem has none).
    /// `fallback` is virtiofsd's deprecated alias.
    #[value(alias = "fallback")]
    Prefer,
    /// Keep file handles, or fail.
    Mandatory,
}

/// --posix-acl and --security-label (virtiofsd's negotiation mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AclMode {
    /// Off (--posix-acl: the ACL xattrs are refused).
    Never,
    /// On if the guest kernel can negotiate it, else off.
    Auto,
    /// On, or no connection.
    Always,
}

/// --log-level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum LogLevel {
    /// Nothing.
    Off,
    /// Errors.
    Error,
    /// Warnings.
    Warn,
    /// Start, stop, connection events.
    Info,
    /// More.
    Debug,
    /// Everything.
    Trace,
}

/// vhost-user-fs device options (virtiofsd-compatible, plus fusebox's own).
#[derive(Debug, clap::Args)]
pub struct VhostArgs {
    /// vhost-user socket to listen on.
    #[arg(long, required_unless_present_any = ["fd", "socket", "print_capabilities"])]
    pub socket_path: Option<PathBuf>,
    /// vhost-user socket to listen on [deprecated: use --socket-path].
    #[arg(long, value_name = "PATH", conflicts_with_all = ["socket_path", "fd"])]
    pub socket: Option<PathBuf>,
    /// A listening vhost-user socket inherited as this fd.
    #[arg(long, conflicts_with = "socket_path")]
    pub fd: Option<i32>,
    /// Group to give the socket (not with --fd, as virtiofsd: the socket
    /// is the caller's then).
    #[arg(long, conflicts_with = "fd")]
    pub socket_group: Option<String>,
    /// Directory to share.
    #[arg(long, required_unless_present_any = ["print_capabilities", "compat_options"])]
    pub shared_dir: Option<PathBuf>,
    /// Tag in the device's config space (offers the CONFIG protocol
    /// feature; without it the VMM gives the tag).
    #[arg(long)]
    pub tag: Option<String>,
    /// Cache policy (as virtiofsd, in any case: `NEVER` is `never`).
    #[arg(long, value_enum, ignore_case = true, default_value = "auto")]
    pub cache: Cache,
    /// Worker threads per request queue. 0 (the default, as in virtiofsd):
    /// each queue's vring thread serves its requests itself, through the
    /// engine, with one standby worker that takes over while a host call
    /// hangs. N: the vring thread serves the first request of each batch
    /// and N workers per queue serve the rest in parallel.
    #[arg(long, default_value_t = 0)]
    pub thread_pool_size: usize,
    /// Sandbox mode (as virtiofsd, namespace by default).
    #[arg(long, value_enum, ignore_case = true, default_value = "namespace")]
    pub sandbox: Sandbox,
    /// Seccomp mode (as virtiofsd, kill by default).
    #[arg(long, value_enum, default_value = "kill")]
    pub seccomp: Seccomp,
    /// Serve extended attributes.
    #[arg(long)]
    pub xattr: bool,
    /// POSIX ACLs, enforced by the guest kernel (implies --xattr unless
    /// never). `--posix-acl` alone is `always`: a guest that cannot
    /// negotiate them gets no connection; `auto` serves it without.
    #[arg(long, value_enum, require_equals = true, num_args = 0..=1, default_missing_value = "always", default_value = "never")]
    pub posix_acl: AclMode,
    /// Security labels (FUSE_SECURITY_CTX, as virtiofsd; implies --xattr
    /// unless never): the label the guest's LSM gives a file, directory,
    /// node or symlink it creates is set on the host inode before the
    /// guest sees it (as `security.selinux` by the host's SELinux where it
    /// runs, otherwise as an xattr under the name --xattrmap gives it,
    /// e.g. `user.virtiofs.security.selinux`); if it cannot be, the
    /// creation is undone and fails. `--security-label` alone is
    /// `always`: a guest that cannot negotiate it gets no connection;
    /// `auto` serves it without.
    #[arg(long, value_enum, require_equals = true, num_args = 0..=1, default_missing_value = "always", default_value = "never", value_name = "MODE")]
    pub security_label: AclMode,
    /// Modify the capabilities the serving process keeps, as virtiofsd:
    /// `+name` keeps, `-name` drops, `:`-separated (e.g.
    /// `--modcaps=+sys_admin:-mknod`), starting from virtiofsd's set
    /// (chown, dac_override, fowner, fsetid, setgid, setuid, mknod,
    /// setfcap; dac_read_search with inode file handles; ipc_lock with
    /// --fixed-guest-memory). Without it fusebox keeps the capabilities
    /// it was started with.
    #[arg(long, value_name = "LIST", allow_hyphen_values = true)]
    pub modcaps: Option<crate::caps::ModCaps>,
    /// Refuse every change.
    #[arg(long)]
    pub readonly: bool,
    /// Negotiate the writeback cache.
    #[arg(long)]
    pub writeback: bool,
    /// Translate UIDs between guest and host, as virtiofsd:
    /// `<type>:<source base>:<target base>:<count>`, where type is `guest`
    /// (guest UIDs to host UIDs, 1:1), `host` (host to guest, 1:1), `map`
    /// (both ways, `map:<guest base>:<host base>:<count>`), `squash-guest`
    /// (a range of guest UIDs to one host UID), `squash-host` (a range of
    /// host UIDs to one guest UID); or `forbid-guest:<guest base>:<count>`:
    /// requests with such a UID, and giving a file one, fail with EPERM.
    /// Repeatable; ranges of one direction must not overlap; a UID no
    /// range covers is the same number on both sides. Capabilities follow
    /// the host UID: a request translated to a host UID other than 0 has
    /// none on the share (the guest's root included).
    #[arg(long, value_name = "MAP")]
    pub translate_uid: Vec<IdMapping>,
    /// The same as --translate-uid, for GIDs.
    #[arg(long, value_name = "MAP")]
    pub translate_gid: Vec<IdMapping>,
    /// The UID translation in force (from --translate-uid).
    #[arg(skip)]
    pub uids: IdMap,
    /// The GID translation in force (from --translate-gid).
    #[arg(skip)]
    pub gids: IdMap,
    /// Tell the guest about submounts (FUSE_ATTR_SUBMOUNT), so each
    /// gets its own st_dev in the guest (off by default; virtiofsd's
    /// default is on).
    #[arg(long)]
    pub announce_submounts: bool,
    /// Do not tell the guest about submounts (the default; the later of
    /// the two options wins, as virtiofsd).
    #[arg(long, overrides_with = "announce_submounts")]
    pub no_announce_submounts: bool,
    /// How inodes are held: `prefer` (the default, as virtiofsd 1.14)
    /// keeps a file handle for each inode where the filesystem gives them,
    /// and its fd only while fewer than half the fds are in use, so a guest
    /// that looks up many files does not use up the daemon's fds; `never`
    /// keeps an fd per inode; `mandatory` refuses a filesystem without
    /// file handles.
    #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "prefer", default_value = "prefer")]
    pub inode_file_handles: FileHandles,
    /// The fd limit to raise RLIMIT_NOFILE to at start (as virtiofsd; by
    /// default the kernel's nr_open, at most 1,000,000; 0 leaves the limit
    /// as it is). Without CAP_SYS_RESOURCE the hard limit stops it. The
    /// daemon keeps a reserve of what is in force for itself; guest
    /// requests beyond the rest get EMFILE.
    #[arg(long)]
    pub rlimit_nofile: Option<u64>,
    /// Log level (in any case, as virtiofsd).
    #[arg(long, value_enum, ignore_case = true, default_value = "info")]
    pub log_level: LogLevel,
    /// Log to syslog instead of stderr.
    #[arg(long)]
    pub syslog: bool,
    /// Print the vhost-user capabilities (JSON, for libvirt) and exit.
    #[arg(long)]
    pub print_capabilities: bool,
    /// Request queues (the guest uses as many as it has CPUs, up to this).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=63))]
    pub queues: u16,
    /// Largest virtqueue the VMM may set up.
    #[arg(long, default_value_t = 1024)]
    pub queue_size: u16,
    /// Guest requests the engine admits at once (all queues).
    #[arg(long, default_value_t = 256)]
    pub max_background: u16,
    /// Where the engine reports congestion.
    #[arg(long, default_value_t = 192)]
    pub congestion_threshold: u16,
    /// Answer a request with EIO after this many seconds (0: never).
    #[arg(long, default_value_t = 0)]
    pub request_timeout: u64,
    /// Data I/O with pread/pwrite only.
    #[arg(long)]
    pub no_io_uring: bool,
    /// Read cached data with preadv2 or io_uring only: no copies out of a
    /// shared mapping of a host file the page cache holds whole (which
    /// take no system call per READ, but skip the host's access hooks:
    /// LSM rechecks, inotify/fanotify access events, atime; see
    /// docs/DESIGN.md, "Mapped reads"). Mapped reads need io_uring on
    /// and x86_64.
    #[arg(long)]
    pub no_mapped_reads: bool,
    /// Register guest RAM as io_uring fixed buffers, so data I/O through
    /// the ring is READ_FIXED/WRITE_FIXED at the guest address. This pins
    /// all of guest RAM in host memory, and breaks anything that discards
    /// guest pages (virtio-balloon inflation, free page reporting or
    /// hinting, virtio-mem unplug): a READ into a discarded and reused page
    /// leaves it zeroed with a success reply, a WRITE from one stores stale
    /// bytes. fusebox cannot see a discard: use it only for VMs without
    /// these.
    #[arg(long, conflicts_with = "no_io_uring")]
    pub fixed_guest_memory: bool,
    /// Requests (READ, WRITE, FSYNC, FALLOCATE) a queue thread starts
    /// before it submits them to the host and answers those already done
    /// (also how many in-line answers share one guest notification). Small
    /// chunks let the guest refill its queue while the rest are served.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub submit_batch: u32,
    /// How long, in microseconds, a queue thread serves in line before it
    /// signals the answers given so far (a guest waiting on a slow request
    /// hears of it without waiting for the rest of its chunk); a request
    /// that takes a tenth of it is signalled as soon as it is done. Raise it
    /// only to profile fusebox under a tool that slows it many times over
    /// (valgrind), so chunks are cut as at full speed.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub chunk_time_us: u64,
    /// The most time, in microseconds, a queue thread keeps looking for
    /// new requests after its queue emptied, before it sleeps until the
    /// guest kicks it (0: it sleeps at once; no polling with
    /// --thread-pool-size). The time adapts to the guest: a guest that
    /// keeps its queue busy is served without wake-ups, at the cost of up
    /// to a CPU per request queue while it does; pauses longer than this
    /// shrink it to nothing.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(0..=1_000))]
    pub poll_max_us: u64,
    /// The DAX window's size (bytes, or with a K, M or G suffix; 0: no
    /// window, the default): a power of two from 2M to 512M. A guest that
    /// mounts with `-o dax=always` then reads and writes files through
    /// host pages mapped into its window, without FUSE requests or a
    /// second page cache. Needs a VMM with vhost-user shared memory
    /// (QEMU 11.1 or later, with its generic vhost-user device; see
    /// docs/DAX.md).
    #[arg(long, value_name = "SIZE", default_value = "0", value_parser = parse_size)]
    pub cache_size: u64,
    /// Options in the legacy `-o a,b=c` format (source, cache, sandbox,
    /// log_level, debug; xattr, flock, posix_lock, posix_acl,
    /// readdirplus, writeback, announce_submounts, killpriv_v2 and
    /// allow_direct_io, security_label, each also as no_NAME; modcaps=;
    /// `,,` is a comma; a later item overrides an earlier one).
    /// Deprecated: use the separate options.
    #[arg(short = 'o', value_name = "SUBOPTS", value_parser = clap::value_parser!(OsString))]
    pub compat_options: Vec<OsString>,
    /// Log level debug [deprecated: use --log-level debug].
    #[arg(short = 'd')]
    pub compat_debug: bool,
    /// No effect (deprecated).
    #[arg(short = 'f')]
    pub compat_foreground: bool,
    /// virtiofsd's options fusebox takes with no effect, or refuses.
    #[command(flatten)]
    pub virtiofsd: VirtiofsdArgs,
    /// Fault injection (tests).
    #[command(flatten)]
    pub faults: FaultArgs,
    /// Deprecation notices of the options given, logged at start.
    #[arg(skip)]
    pub notices: Vec<String>,
    /// `-o no_flock`: FLOCK_LOCKS is not offered (the guest kernel keeps
    /// flock locks to itself). Only through `-o`.
    #[arg(skip)]
    pub no_flock: bool,
    /// `-o no_posix_lock`: POSIX_LOCKS is not offered. Only through `-o`.
    #[arg(skip)]
    pub no_posix_lock: bool,
    /// `-o no_allow_direct_io`: O_DIRECT is dropped from host opens
    /// (virtiofsd's default). Only through `-o`.
    #[arg(skip)]
    pub no_direct_io: bool,
}

/// virtiofsd 1.14's options that have no fusebox option of their own:
/// those that ask for what fusebox always does are taken (no effect), the
/// rest are recognised only to be refused at start with a message naming
/// them (`crate::compat`), never ignored.
#[derive(Debug, Clone, clap::Args)]
pub struct VirtiofsdArgs {
    /// Honour O_DIRECT from the guest: no effect, fusebox's default
    /// (`-o no_allow_direct_io` drops it, as virtiofsd's default).
    #[arg(long)]
    pub allow_direct_io: bool,
    /// Allow shared mmap with --cache never|metadata: no effect, fusebox
    /// always does (FUSE_DIRECT_IO_ALLOW_MMAP).
    #[arg(long)]
    pub allow_mmap: bool,
    /// Keep O_NOATIME on opens: no effect, fusebox always does.
    #[arg(long)]
    pub preserve_noatime: bool,
    /// Offer KILLPRIV_V2: fusebox's default when it runs as root (writes
    /// then run as the caller); asked for otherwise, start-up fails.
    #[arg(long)]
    pub killpriv_v2: bool,
    /// Do not offer KILLPRIV_V2 (virtiofsd's default; fusebox's when not
    /// root): the guest kernel clears setuid/setgid itself with a SETATTR,
    /// which runs as the writer. The later of the two options wins.
    #[arg(long, overrides_with = "killpriv_v2")]
    pub no_killpriv_v2: bool,
    /// Do not offer READDIRPLUS: the guest lists directories with READDIR
    /// and looks entries up one by one.
    #[arg(long)]
    pub no_readdirplus: bool,
    /// Rename, hide or refuse xattr names between guest and host, in
    /// virtiofsd's rule language (e.g. `:map::user.virtiofs.:` keeps every
    /// guest xattr under `user.virtiofs.` on the host); the rules must end
    /// with catch-alls for both directions. Implies --xattr.
    #[arg(long, value_name = "RULES")]
    pub xattrmap: Option<passthrough::XattrMap>,
    /// Started unprivileged with --sandbox namespace: map these uids into
    /// its user namespace, `:inside:outside:count:` (repeatable; written
    /// by newuidmap(1) from the user's /etc/subuid ranges unless it is the
    /// user's own uid alone). Default: the user's uid as 0.
    #[arg(long, value_name = "MAP")]
    pub uid_map: Vec<crate::userns::NsIdMap>,
    /// The same for gids (newgidmap(1), /etc/subgid). Default: the user's
    /// gid as 0.
    #[arg(long, value_name = "MAP")]
    pub gid_map: Vec<crate::userns::NsIdMap>,
    /// Live migration: how the source names each file the guest uses for
    /// the destination: `find-paths` (its path below the shared
    /// directory, confirmed by a stat) or `file-handles` (its file handle;
    /// both daemons on the same filesystem, the destination with
    /// CAP_DAC_READ_SEARCH; reaches files unlinked while open).
    #[arg(long, value_enum, value_name = "MODE", default_value = "find-paths")]
    pub migration_mode: MigrationMode,
    /// Live migration: a file that cannot be carried over (found on the
    /// source, opened on the destination) fails the migration (`abort`;
    /// the source VM goes on) or is carried over as lost: the guest gets
    /// EIO on it (`guest-error`).
    #[arg(long, value_enum, value_name = "MODE", default_value = "abort")]
    pub migration_on_error: MigrationOnError,
    /// Live migration with `find-paths`: send each file's handle too; the
    /// destination refuses a path that leads to another file.
    #[arg(long)]
    pub migration_verify_handles: bool,
    /// Live migration: confirm each path before sending it (fusebox
    /// always does: a path that no longer leads to the file is an error).
    #[arg(long)]
    pub migration_confirm_paths: bool,
}

/// Fault injection into the filesystem, for testing what stands in front
/// of it (`fuse_core::server::faults`).
#[derive(Debug, Clone, clap::Args)]
pub struct FaultArgs {
    /// Testing only: make filesystem operations misbehave. Comma-separated
    /// rules `OP:FAULT[:p=P][:after=N][:times=N]`, OP a FUSE opcode name or
    /// *, FAULT one of delay=DUR (5ms, 2s), hang (until interrupted),
    /// error=ERRNO, short (READ/WRITE on part of the data), gather=N (held
    /// until N calls are held at once). Example:
    /// read:error=EIO:p=0.1,getattr:hang:after=100
    #[arg(long, value_name = "RULES")]
    pub inject_faults: Option<String>,
    /// Seed of --inject-faults' draws.
    #[arg(long, default_value_t = 1)]
    pub fault_seed: u64,
}

impl FaultArgs {
    /// The plan (empty without --inject-faults).
    pub fn plan(&self) -> Result<FaultPlan, PlanError> {
        match &self.inject_faults {
            Some(spec) => FaultPlan::parse(spec, self.fault_seed),
            None => Ok(FaultPlan::default()),
        }
    }
}

/// A size in bytes, or with a K, M or G suffix (powers of 1024).
fn parse_size(s: &str) -> Result<u64, String> {
    let (digits, shift) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 20),
        Some(b'G' | b'g') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|e| format!("{s:?} is not a size: {e}"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

#[cfg(test)]
mod size_tests {
    use super::parse_size;

    #[test]
    fn sizes_take_a_suffix() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("2M"), Ok(2 << 20));
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("8k"), Ok(8192));
        for bad in ["", "M", "2T", "-1", "1.5G", "99999999999G"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
