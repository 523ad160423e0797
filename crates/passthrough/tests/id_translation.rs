//! `Config::translate_uid` / `translate_gid` (virtiofsd's `--translate-uid`
//! and `--translate-gid`) over a real host directory, through the
//! engine's client: who owns what a client creates, what owners the client
//! sees, chown, forbidden IDs, and the IDs inside ACLs, each checked on
//! the host itself. Needs root (tmpfs mounts, files of other owners).

mod common;

use common::{chmod, chown, set_ids, HostDir, Kind, Mount, Via};
use fuse_core::abi::Xattr;
use fuse_core::abi::{fattr, init, SetattrIn, ROOT_ID};
use fuse_core::client::Client;
use fuse_core::Errno;
use passthrough::testing::acl::{
    acl, host_setxattr, host_xattr, reader_acl, GROUP_OBJ, MASK, NONE, OTHER, USER, USER_OBJ,
};
use passthrough::Config;
use passthrough::{IdMap, IdMapping};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

const RW: u32 = libc::O_RDWR as u32;
const ACCESS: &[u8] = b"system.posix_acl_access";
const DEFAULT: &[u8] = b"system.posix_acl_default";
/// Forbidden as a uid and as a gid.
const FORBIDDEN: u32 = 66666;

fn ids(specs: &[&str]) -> IdMap {
    let m: Vec<IdMapping> = specs.iter().map(|s| s.parse().unwrap()).collect();
    IdMap::new(&m).unwrap()
}

/// Guest uids 0-2999 are host 100000-102999 and back; guest 3000-3999 all
/// host 90000; guest 4000 host 0, root (that way only); guest 5000-5009
/// host 150000-150009 (that way only); host 160000-160009 guest 6000-6009
/// (that way only); host 200000-200999 all guest 65534; guest 66666
/// forbidden. Gids: 0-2999 as the uids, 4000 host 0, 66666 forbidden.
fn cfg() -> Config {
    Config {
        translate_uid: ids(&[
            "map:0:100000:3000",
            "squash-guest:3000:90000:1000",
            "guest:4000:0:1",
            "guest:5000:150000:10",
            "host:160000:6000:10",
            "squash-host:200000:65534:1000",
            "forbid-guest:66666:1",
        ]),
        translate_gid: ids(&[
            "map:0:100000:3000",
            "guest:4000:0:1",
            "forbid-guest:66666:1",
        ]),
        ..Config::default()
    }
}

/// The guest user translated to host root.
const HOST_ROOT: u32 = 4000;

fn share() -> Mount {
    Mount::new(Kind::Tmpfs, cfg(), Via::Device(2))
}

/// Owner and group of `p` on the host (not following a symlink).
fn owner(p: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.uid(), m.gid())
}

/// A directory anyone may create in, made by the guest's root.
fn pub_dir(m: &Mount) -> u64 {
    let d = m.client.mkdir(ROOT_ID, b"pub", 0o777, 0).unwrap();
    assert_eq!(owner(&m.path("pub")), (100000, 100000));
    d.nodeid
}

#[test]
fn what_a_client_creates_belongs_to_its_translated_ids() {
    let m = share();
    let root = &m.client;
    let (f, o) = root.create(ROOT_ID, b"f", 0o644, RW, 0).unwrap();
    root.release(f.nodeid, o.fh, 0).unwrap();
    let made = [
        ("f", f),
        ("d", root.mkdir(ROOT_ID, b"d", 0o755, 0).unwrap()),
        ("s", root.symlink(ROOT_ID, b"s", b"f").unwrap()),
        (
            "p",
            root.mknod(ROOT_ID, b"p", libc::S_IFIFO | 0o644, 0, 0)
                .unwrap(),
        ),
    ];
    for (name, e) in made {
        assert_eq!(owner(&m.path(name)), (100000, 100000), "{name} on the host");
        assert_eq!(
            (e.attr.uid, e.attr.gid),
            (0, 0),
            "{name} as the guest sees it"
        );
    }
    let (t, o) = root.tmpfile(ROOT_ID, 0o600, RW, 0).unwrap();
    assert_eq!((t.attr.uid, t.attr.gid), (0, 0));
    root.release(t.nodeid, o.fh, 0).unwrap();
    // A hard link is made as the caller too.
    root.link(f.nodeid, ROOT_ID, b"l").unwrap();

    let p = pub_dir(&m);
    for (uid, gid, name, host) in [
        (1000, 1000, "u1000", (101000, 101000)),
        // Squashed: two guest users, one host uid.
        (3001, 1000, "u3001", (90000, 101000)),
        (3999, 1000, "u3999", (90000, 101000)),
        // One way: the host owner is shown as it is.
        (5003, 1000, "u5003", (150003, 101000)),
        // Not covered: the same number.
        (70000, 70000, "u70000", (70000, 70000)),
    ] {
        let c = m.client.as_user(uid, gid);
        let (e, o) = c.create(p, name.as_bytes(), 0o644, RW, 0).unwrap();
        c.release(e.nodeid, o.fh, 0).unwrap();
        assert_eq!(owner(&m.path("pub").join(name)), host, "{name} on the host");
        let seen = (
            match uid {
                3000..=3999 => 90000,
                5000..=5009 => 150000 + uid - 5000,
                u => u,
            },
            gid,
        );
        assert_eq!(
            (e.attr.uid, e.attr.gid),
            seen,
            "{name} as the guest sees it"
        );
    }
}

/// The owners of `name` in every reply that carries attributes.
fn seen_everywhere(c: &Client, name: &str) -> Vec<(&'static str, u32, u32)> {
    let e = c.lookup(ROOT_ID, name.as_bytes()).unwrap();
    let a = c.getattr(e.nodeid, None).unwrap().attr;
    let sx = c
        .statx(e.nodeid, None, 0, libc::STATX_BASIC_STATS)
        .unwrap()
        .stat;
    let dir = c.opendir(ROOT_ID).unwrap();
    let listed = c.readdirplus(ROOT_ID, dir.fh, 0, 64 << 10).unwrap();
    c.releasedir(ROOT_ID, dir.fh).unwrap();
    let plus = listed
        .iter()
        .find(|d| d.dirent.name == name.as_bytes())
        .unwrap()
        .entry
        .attr;
    vec![
        ("lookup", e.attr.uid, e.attr.gid),
        ("getattr", a.uid, a.gid),
        ("statx", sx.uid, sx.gid),
        ("readdirplus", plus.uid, plus.gid),
    ]
}

#[test]
fn every_attribute_reply_shows_the_guests_ids() {
    let m = share();
    for (name, host, guest) in [
        ("mapped", (100005, 100007), (5, 7)),
        ("squashed", (200123, 100001), (65534, 1)),
        ("one-way-in", (160003, 0), (6003, 0)),
        // guest 5000 is host 150000, but host 150000 is shown as itself.
        ("one-way-out", (150000, 0), (150000, 0)),
        ("uncovered", (424242, 424242), (424242, 424242)),
    ] {
        std::fs::write(m.path(name), b"x").unwrap();
        chown(&m.path(name), host.0, host.1);
        for (reply, uid, gid) in seen_everywhere(&m.client, name) {
            assert_eq!((uid, gid), guest, "{name}: {reply}");
        }
    }
    // SETATTR's reply too (by the owner, host uid 100005).
    let e = m.client.lookup(ROOT_ID, b"mapped").unwrap();
    let sa = SetattrIn {
        valid: fattr::MODE,
        mode: 0o600,
        ..Default::default()
    };
    let a = m.client.as_user(5, 7).setattr(e.nodeid, &sa).unwrap().attr;
    assert_eq!((a.uid, a.gid), (5, 7));
}

#[test]
fn chown_gives_the_translated_host_ids_and_never_a_forbidden_one() {
    let m = share();
    let (f, o) = m.client.create(ROOT_ID, b"f", 0o644, RW, 0).unwrap();
    m.client.release(f.nodeid, o.fh, 0).unwrap();
    let host = m.path("f");
    // The guest's root is host uid 100000, which may not give its file
    // away; the guest user translated to host root may.
    assert_eq!(
        set_ids(&m.client, f.nodeid, Some(5), Some(7)),
        Err(Errno::EPERM)
    );
    assert_eq!(owner(&host), (100000, 100000));
    let root = m.client.as_user(HOST_ROOT, HOST_ROOT);
    assert_eq!(set_ids(&root, f.nodeid, Some(5), Some(7)), Ok((5, 7)));
    assert_eq!(owner(&host), (100005, 100007));
    assert_eq!(set_ids(&root, f.nodeid, Some(3500), None), Ok((90000, 7)));
    assert_eq!(owner(&host), (90000, 100007));
    assert_eq!(set_ids(&root, f.nodeid, Some(70000), None), Ok((70000, 7)));
    assert_eq!(owner(&host), (70000, 100007));
    // Forbidden: EPERM, and nothing changes (not the other ID either).
    for (uid, gid) in [
        (Some(FORBIDDEN), None),
        (None, Some(FORBIDDEN)),
        (Some(1), Some(FORBIDDEN)),
    ] {
        assert_eq!(
            set_ids(&root, f.nodeid, uid, gid),
            Err(Errno::EPERM),
            "{uid:?} {gid:?}"
        );
        assert_eq!(owner(&host), (70000, 100007));
    }
    // A user translated to an unprivileged host uid has no CAP_CHOWN.
    chown(&host, 101000, 101000);
    let user = m.client.as_user(1000, 1000);
    assert_eq!(
        set_ids(&user, f.nodeid, Some(1001), None),
        Err(Errno::EPERM)
    );
    assert_eq!(owner(&host), (101000, 101000));
}

#[test]
fn a_forbidden_caller_gets_eperm_for_whatever_runs_as_the_caller() {
    let m = share();
    let p = pub_dir(&m);
    let (f, o) = m.client.create(p, b"f", 0o666, RW, 0).unwrap();
    m.client.release(f.nodeid, o.fh, 0).unwrap();
    for who in [
        m.client.as_user(FORBIDDEN, 1000),
        m.client.as_user(1000, FORBIDDEN),
    ] {
        assert_eq!(who.create(p, b"g", 0o644, RW, 0).unwrap_err(), Errno::EPERM);
        assert_eq!(who.mkdir(p, b"h", 0o755, 0).unwrap_err(), Errno::EPERM);
        assert_eq!(who.symlink(p, b"i", b"f").unwrap_err(), Errno::EPERM);
        assert_eq!(who.lookup(p, b"f").unwrap_err(), Errno::EPERM);
        assert_eq!(who.open(f.nodeid, RW).unwrap_err(), Errno::EPERM);
        assert_eq!(who.access(f.nodeid, 4).unwrap_err(), Errno::EPERM);
        assert_eq!(who.unlink(p, b"f").unwrap_err(), Errno::EPERM);
        let sa = SetattrIn {
            valid: fattr::MODE,
            mode: 0o600,
            ..Default::default()
        };
        assert_eq!(who.setattr(f.nodeid, &sa).unwrap_err(), Errno::EPERM);
        // What needs no credentials is answered.
        assert!(who.getattr(f.nodeid, None).is_ok());
    }
    let names: Vec<_> = std::fs::read_dir(m.path("pub"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["f"], "nothing made, nothing removed");
    assert_eq!(
        std::fs::metadata(m.path("pub/f"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o666
    );
    // A handle opened by someone else stays usable by a forbidden
    // caller only where no credentials are needed (reads).
    let (g, o) = m.client.create(p, b"g", 0o666, RW, 0).unwrap();
    m.client.write(g.nodeid, o.fh, 0, b"data", 0).unwrap();
    let who = m.client.as_user(FORBIDDEN, 1000);
    assert_eq!(who.read(g.nodeid, o.fh, 0, 4).unwrap(), b"data");
    assert_eq!(
        who.write(g.nodeid, o.fh, 0, b"more", 0).unwrap_err(),
        Errno::EPERM
    );
    m.client.release(g.nodeid, o.fh, 0).unwrap();
}

fn acl_share() -> Mount {
    let host = HostDir::new(Kind::Tmpfs);
    let share = host.path.clone();
    let cfg = Config {
        posix_acl: true,
        ..cfg()
    };
    Mount::offering(host, &share, cfg, Via::Device(2), init::POSIX_ACL, 0).unwrap()
}

fn guest_xattr(c: &Client, node: u64, name: &[u8]) -> Vec<u8> {
    let Xattr::Size(n) = c.getxattr(node, name, 0).unwrap() else {
        panic!("no size")
    };
    let Xattr::Data(d) = c.getxattr(node, name, 4096).unwrap() else {
        panic!("no data")
    };
    assert_eq!(n as usize, d.len());
    d
}

const ACL_GROUP: u16 = 0x08;

#[test]
fn acl_entries_name_host_ids_on_the_host_and_guest_ids_in_the_guest() {
    let m = acl_share();
    let (f, o) = m.client.create(ROOT_ID, b"f", 0o600, RW, 0).unwrap();
    m.client.write(f.nodeid, o.fh, 0, b"secret", 0).unwrap();
    m.client.release(f.nodeid, o.fh, 0).unwrap();
    // user:5:r (host 100005), group:9:r (host 100009).
    let guest = acl(&[
        (USER_OBJ, 6, NONE),
        (USER, 4, 5),
        (GROUP_OBJ, 0, NONE),
        (ACL_GROUP, 4, 9),
        (MASK, 4, NONE),
        (OTHER, 0, NONE),
    ]);
    let host = acl(&[
        (USER_OBJ, 6, NONE),
        (USER, 4, 100005),
        (GROUP_OBJ, 0, NONE),
        (ACL_GROUP, 4, 100009),
        (MASK, 4, NONE),
        (OTHER, 0, NONE),
    ]);
    m.client.setxattr(f.nodeid, ACCESS, &guest, 0).unwrap();
    assert_eq!(host_xattr(&m.path("f"), ACCESS), Some(host));
    assert_eq!(guest_xattr(&m.client, f.nodeid, ACCESS), guest);
    // The host enforces the entry for the guest's user 5: it runs as
    // host 100005, whom the host ACL names.
    let five = m.client.as_user(5, 5);
    let o = five.open(f.nodeid, libc::O_RDONLY as u32).unwrap();
    assert_eq!(five.read(f.nodeid, o.fh, 0, 6).unwrap(), b"secret");
    five.release(f.nodeid, o.fh, 0).unwrap();
    assert_eq!(
        m.client
            .as_user(6, 6)
            .open(f.nodeid, libc::O_RDONLY as u32)
            .unwrap_err(),
        Errno(libc::EACCES)
    );
    // An ACL set on the host shows guest IDs (squashed ones included).
    host_setxattr(&m.path("f"), ACCESS, &reader_acl(200500));
    assert_eq!(guest_xattr(&m.client, f.nodeid, ACCESS), reader_acl(65534));
    // Default ACLs too.
    let d = m.client.mkdir(ROOT_ID, b"d", 0o755, 0).unwrap();
    m.client
        .setxattr(d.nodeid, DEFAULT, &reader_acl(7), 0)
        .unwrap();
    assert_eq!(host_xattr(&m.path("d"), DEFAULT), Some(reader_acl(100007)));
    assert_eq!(guest_xattr(&m.client, d.nodeid, DEFAULT), reader_acl(7));
    // A forbidden ID in an ACL: EPERM, the ACL unchanged.
    assert_eq!(
        m.client
            .setxattr(d.nodeid, DEFAULT, &reader_acl(FORBIDDEN), 0)
            .unwrap_err(),
        Errno::EPERM
    );
    assert_eq!(host_xattr(&m.path("d"), DEFAULT), Some(reader_acl(100007)));
    // Other xattrs pass as they are.
    m.client
        .setxattr(f.nodeid, b"user.k", &reader_acl(5), 0)
        .unwrap();
    assert_eq!(host_xattr(&m.path("f"), b"user.k"), Some(reader_acl(5)));
    // The file's owner is the guest's root's host uid all along.
    assert_eq!(owner(&m.path("f")).0, 100000);
}

/// A process (`sleep`) whose supplementary groups are `groups`.
fn with_groups(groups: &'static [libc::gid_t]) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new("sleep");
    cmd.arg("60");
    // SAFETY: setgroups is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setgroups(groups.len(), groups.as_ptr()) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    cmd.spawn().unwrap()
}

#[test]
fn supplementary_groups_read_from_proc_are_translated_too() {
    // Host mounts take a caller's groups from /proc/<pid>/status: those
    // are the client's gids as well.
    let m = Mount::new(
        Kind::Tmpfs,
        Config {
            groups: passthrough::Groups::Proc,
            ..cfg()
        },
        Via::Device(2),
    );
    let dir = m.path("group5");
    std::fs::create_dir(&dir).unwrap();
    chown(&dir, 0, 100005);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o070)).unwrap();
    let d = m.client.lookup(ROOT_ID, b"group5").unwrap().nodeid;
    let mut member = with_groups(&[5]);
    let mut outsider = with_groups(&[6]);
    let mut forbidden = with_groups(&[5, FORBIDDEN]);
    let as_pid = |c: &std::process::Child| m.client.as_user(1000, 1000).with_pid(c.id());
    // Guest group 5 is host group 100005, the directory's.
    let e = as_pid(&member).mkdir(d, b"in", 0o755, 0).unwrap();
    assert_eq!((e.attr.uid, e.attr.gid), (1000, 1000));
    assert_eq!(owner(&dir.join("in")), (101000, 101000));
    assert_eq!(
        as_pid(&outsider).mkdir(d, b"out", 0o755, 0).unwrap_err(),
        Errno(libc::EACCES)
    );
    assert_eq!(
        as_pid(&forbidden).mkdir(d, b"no", 0o755, 0).unwrap_err(),
        Errno::EPERM
    );
    for c in [&mut member, &mut outsider, &mut forbidden] {
        c.kill().unwrap();
        c.wait().unwrap();
    }
}

#[test]
fn a_write_keeps_setuid_only_for_a_writer_that_is_host_root() {
    // Guests 0 and 1 are both host 100000, guest 2 is host 0. A handle
    // the guest's root opened keeps setuid only through a write by guest
    // 2 (CAP_FSETID, as host root); the guest's root's own write, as host
    // 100000, clears it as any user's does.
    let m = Mount::new(
        Kind::Tmpfs,
        Config {
            translate_uid: ids(&["squash-guest:0:100000:2", "guest:2:0:1"]),
            translate_gid: ids(&["squash-guest:0:100000:2", "guest:2:0:1"]),
            ..Config::default()
        },
        Via::Device(2),
    );
    let (f, o) = m.client.create(ROOT_ID, b"prog", 0o755, RW, 0).unwrap();
    let prog = m.path("prog");
    assert_eq!(owner(&prog), (100000, 100000));
    let mode = || std::fs::metadata(&prog).unwrap().permissions().mode() & 0o7777;
    let setuid = || std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o4755));
    setuid().unwrap();
    m.client
        .as_user(2, 2)
        .write(f.nodeid, o.fh, 0, b"host root", 0)
        .unwrap();
    assert_eq!(mode(), 0o4755, "host root's write keeps setuid");
    m.client.write(f.nodeid, o.fh, 0, b"root", 0).unwrap();
    assert_eq!(mode(), 0o755, "the guest's root's write clears it");
    setuid().unwrap();
    m.client
        .as_user(1, 1)
        .write(f.nodeid, o.fh, 0, b"user", 0)
        .unwrap();
    assert_eq!(mode(), 0o755, "so does a user's");
    m.client.release(f.nodeid, o.fh, 0).unwrap();
}

/// Guest uid and gid 0 squashed onto host 65534 (as
/// `--translate-uid squash-guest:0:65534:1`), guest 4000 translated to
/// host root.
fn squashed_root() -> Mount {
    let specs = ["squash-guest:0:65534:1", "guest:4000:0:1"];
    Mount::new(
        Kind::Tmpfs,
        Config {
            translate_uid: ids(&specs),
            translate_gid: ids(&specs),
            ..Config::default()
        },
        Via::Device(2),
    )
}

/// Block device 8:0 and character device 1:3, as FUSE encodes them.
const BLOCK_8_0: (u32, u32) = (libc::S_IFBLK, 8 << 8);
const CHAR_1_3: (u32, u32) = (libc::S_IFCHR, (1 << 8) | 3);

fn mode_of(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

fn times(c: &Client, node: u64) -> Result<(), Errno> {
    let sa = SetattrIn {
        valid: fattr::ATIME | fattr::MTIME,
        atime: 1,
        mtime: 1,
        ..Default::default()
    };
    c.setattr(node, &sa).map(drop)
}

/// What the share holds that neither caller made: a file of host uid
/// 1000 (mode 0600), a directory of 1000 (0700) with a file in it, a
/// sticky directory of root's with a file of 1000 in it, and a file of
/// host 65534 (0644).
fn others_files(m: &Mount) {
    std::fs::write(m.path("theirs"), b"secret").unwrap();
    chown(&m.path("theirs"), 1000, 1000);
    std::fs::set_permissions(m.path("theirs"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::create_dir(m.path("closed")).unwrap();
    std::fs::write(m.path("closed/in"), b"x").unwrap();
    chown(&m.path("closed"), 1000, 1000);
    std::fs::set_permissions(m.path("closed"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::create_dir(m.path("sticky")).unwrap();
    std::fs::set_permissions(m.path("sticky"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::write(m.path("sticky/theirs"), b"x").unwrap();
    chown(&m.path("sticky/theirs"), 1000, 1000);
    std::fs::write(m.path("mine"), b"x").unwrap();
    chown(&m.path("mine"), 65534, 65534);
}

#[test]
fn a_guests_root_translated_to_another_uid_keeps_no_capability() {
    // Each capability a root caller would use, refused to the guest's
    // root as host 65534 exactly as to a host process of 65534, and
    // nothing left on the host.
    let m = squashed_root();
    others_files(&m);
    let root = &m.client;
    let node = |name: &str| root.lookup(ROOT_ID, name.as_bytes()).unwrap().nodeid;
    // CAP_MKNOD: no device node, block or character.
    for (kind, rdev) in [BLOCK_8_0, CHAR_1_3] {
        assert_eq!(
            root.mknod(ROOT_ID, b"dev", kind | 0o666, rdev, 0)
                .unwrap_err(),
            Errno::EPERM,
            "{kind:o}"
        );
        assert!(std::fs::symlink_metadata(m.path("dev")).is_err());
    }
    // A FIFO needs none (the share's root is tmpfs's 1777).
    root.mknod(ROOT_ID, b"fifo", libc::S_IFIFO | 0o644, 0, 0)
        .unwrap();
    assert_eq!(owner(&m.path("fifo")), (65534, 65534));
    // CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH: another's 0600 file and 0700
    // directory stay closed.
    let theirs = node("theirs");
    assert_eq!(
        root.open(theirs, libc::O_RDONLY as u32).unwrap_err(),
        Errno(libc::EACCES)
    );
    let closed = node("closed");
    assert_eq!(root.lookup(closed, b"in").unwrap_err(), Errno(libc::EACCES));
    // CAP_FOWNER: no chmod or explicit times on another's file, no
    // unlink of another's file in a sticky directory.
    assert_eq!(chmod(root, theirs, 0o666), Err(Errno::EPERM));
    assert_eq!(times(root, theirs), Err(Errno::EPERM));
    let sticky = node("sticky");
    assert_eq!(root.unlink(sticky, b"theirs").unwrap_err(), Errno::EPERM);
    // CAP_CHOWN: its own file not given away, another's not taken.
    let mine = node("mine");
    assert_eq!(set_ids(root, mine, Some(1000), None), Err(Errno::EPERM));
    assert_eq!(set_ids(root, theirs, None, Some(65534)), Err(Errno::EPERM));
    // CAP_SYS_ADMIN: no trusted.* xattr.
    assert_eq!(
        root.setxattr(mine, b"trusted.k", b"v", 0).unwrap_err(),
        Errno::EPERM
    );
    assert_eq!(owner(&m.path("theirs")), (1000, 1000));
    assert_eq!(mode_of(&m.path("theirs")), 0o600);
    assert_eq!(owner(&m.path("mine")), (65534, 65534));
    assert!(m.path("sticky/theirs").exists());
    assert_eq!(host_xattr(&m.path("mine"), b"trusted.k"), None);
}

#[test]
fn a_guest_user_translated_to_host_root_has_roots_capabilities() {
    // The same calls by guest 4000, host root: each succeeds.
    let m = squashed_root();
    others_files(&m);
    let root = m.client.as_user(HOST_ROOT, HOST_ROOT);
    let node = |name: &str| root.lookup(ROOT_ID, name.as_bytes()).unwrap().nodeid;
    for (i, (kind, rdev)) in [BLOCK_8_0, CHAR_1_3].into_iter().enumerate() {
        let name = format!("dev{i}");
        root.mknod(ROOT_ID, name.as_bytes(), kind | 0o600, rdev, 0)
            .unwrap();
        let ft = std::fs::symlink_metadata(m.path(&name))
            .unwrap()
            .file_type();
        use std::os::unix::fs::FileTypeExt;
        assert!(ft.is_block_device() || ft.is_char_device());
        assert_eq!(owner(&m.path(&name)), (0, 0));
    }
    let theirs = node("theirs");
    let o = root.open(theirs, libc::O_RDONLY as u32).unwrap();
    assert_eq!(root.read(theirs, o.fh, 0, 6).unwrap(), b"secret");
    root.release(theirs, o.fh, 0).unwrap();
    root.lookup(node("closed"), b"in").unwrap();
    chmod(&root, theirs, 0o640).unwrap();
    assert_eq!(mode_of(&m.path("theirs")), 0o640);
    times(&root, theirs).unwrap();
    assert_eq!(
        std::fs::metadata(m.path("theirs")).unwrap().mtime(),
        1,
        "explicit times set"
    );
    let mine = node("mine");
    root.setxattr(mine, b"trusted.k", b"v", 0).unwrap();
    assert_eq!(
        host_xattr(&m.path("mine"), b"trusted.k"),
        Some(b"v".to_vec())
    );
    assert_eq!(set_ids(&root, mine, Some(1000), Some(7)), Ok((1000, 7)));
    assert_eq!(owner(&m.path("mine")), (1000, 7));
    root.unlink(node("sticky"), b"theirs").unwrap();
    assert!(!m.path("sticky/theirs").exists());
}
