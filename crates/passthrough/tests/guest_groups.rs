//! A guest's callers' groups, which the host does not know
//! (`Groups::None`, as the vhost-user device serves): the passthrough
//! driven as a guest kernel drives it. The guest kernel has already checked
//! what depends on its caller's groups (virtiofs mounts always use
//! `default_permissions`), so:
//!
//! - the owner of a file gives it a group (SETATTR with a gid) and a
//!   setgid mode the guest allowed, nobody else does, and no uid moves;
//! - with FUSE_CREATE_SUPP_GROUP the group a creating request names
//!   (FUSE_EXT_GROUPS: the parent's, when the caller is a member) is one
//!   of its groups on the host, translated by `translate_gid`.
//!
//! Host mounts (`Groups::Proc`) keep the host kernel's own rules. Needs
//! root (tmpfs mounts, files of other owners).

mod common;

use common::{chmod, chown, set_ids, HostDir, Kind, Mount, Via};
use fuse_core::abi::{encode, encode::Body, init, *};
use fuse_core::client::Client;
use fuse_core::{Args, Errno};
use passthrough::testing::acl::{host_setxattr, host_xattr};
use passthrough::{Config, Groups, IdMap, IdMapping};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use zerocopy::FromBytes;

/// The caller of every test: uid and gid 65534, a member of 65531 (and
/// 65532) in the guest only.
const ME: u32 = 65534;
const TEAM: u32 = 65531;

fn owner(p: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.uid(), m.gid())
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn set_mode(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn served(groups: Groups, translate_gid: IdMap, offer: u64) -> Mount {
    let host = HostDir::new(Kind::Tmpfs);
    let share = host.path.clone();
    let cfg = Config {
        groups,
        translate_gid,
        ..Config::default()
    };
    Mount::offering(host, &share, cfg, Via::Device(2), offer, 0).unwrap()
}

/// A file of `uid`:`gid`, mode 0644, in the share's root; its node id.
fn file(m: &Mount, name: &str, uid: u32, gid: u32) -> u64 {
    std::fs::write(m.path(name), b"x").unwrap();
    chown(&m.path(name), uid, gid);
    set_mode(&m.path(name), 0o644);
    m.client.lookup(ROOT_ID, name.as_bytes()).unwrap().nodeid
}

#[test]
fn a_files_owner_gives_it_a_group_and_setgid_the_guest_allowed() {
    let m = served(Groups::None, IdMap::default(), 0);
    let me = m.client.as_user(ME, ME);
    let f = file(&m, "f", ME, ME);
    let host = m.path("f");
    // `chown FILE -1 65531` by a member of 65531 (guest-side only).
    assert_eq!(set_ids(&me, f, None, Some(TEAM)), Ok((ME, TEAM)));
    assert_eq!(owner(&host), (ME, TEAM));
    // `chown FILE 65534 65532`: the uid stays the owner's.
    assert_eq!(set_ids(&me, f, Some(ME), Some(65532)), Ok((ME, 65532)));
    assert_eq!(owner(&host), (ME, 65532));
    // No other uid, with or without a group.
    assert_eq!(set_ids(&me, f, Some(1000), None), Err(Errno::EPERM));
    assert_eq!(set_ids(&me, f, Some(1000), Some(TEAM)), Err(Errno::EPERM));
    assert_eq!(owner(&host), (ME, 65532));
    // chmod g+s of a file whose group is the caller's in the guest only:
    // the mode as the guest sent it.
    chmod(&me, f, 0o2755).unwrap();
    assert_eq!(mode(&host), 0o2755);
    // Someone else's file: no group, no mode.
    let g = file(&m, "g", 1000, 1000);
    assert_eq!(set_ids(&me, g, None, Some(ME)), Err(Errno::EPERM));
    assert_eq!(chmod(&me, g, 0o2777), Err(Errno::EPERM));
    assert_eq!(owner(&m.path("g")), (1000, 1000));
    assert_eq!(mode(&m.path("g")), 0o644);
}

#[test]
fn a_forbidden_group_is_given_to_nothing() {
    let forbid = IdMap::new(&["forbid-guest:66666:1".parse::<IdMapping>().unwrap()]).unwrap();
    let m = served(Groups::None, forbid, 0);
    let me = m.client.as_user(ME, ME);
    let f = file(&m, "f", ME, ME);
    assert_eq!(set_ids(&me, f, None, Some(66666)), Err(Errno::EPERM));
    assert_eq!(owner(&m.path("f")), (ME, ME));
}

#[test]
fn a_host_mounts_callers_keep_the_host_kernels_rules() {
    // Groups from /proc (the caller is this test process, whose groups
    // hold neither 65531 nor 65534's group): the host decides alone.
    let m = served(Groups::Proc, IdMap::default(), 0);
    let me = m.client.as_user(ME, ME).with_pid(std::process::id());
    let f = file(&m, "f", ME, ME);
    assert_eq!(set_ids(&me, f, None, Some(TEAM)), Err(Errno::EPERM));
    assert_eq!(owner(&m.path("f")), (ME, ME));
    chown(&m.path("f"), ME, TEAM);
    chmod(&me, f, 0o2755).unwrap();
    assert_eq!(mode(&m.path("f")), 0o755, "setgid stripped by the host");
    let n = m.client.chan().negotiated().unwrap();
    assert_eq!(
        n.flags & init::CREATE_SUPP_GROUP,
        0,
        "no groups extension asked of a host kernel"
    );
}

/// MKDIR or CREATE of `name` in `parent` by [`ME`] with `mode`, umask 0,
/// and a FUSE_EXT_GROUPS extension naming `groups` (none: no extension).
fn make(
    c: &Client,
    op: Opcode,
    parent: u64,
    name: &[u8],
    mode: u32,
    groups: Option<&[u32]>,
) -> Result<(), Errno> {
    let body = match op {
        Opcode::Mkdir => Body::new().push(&MkdirIn { mode, umask: 0 }),
        Opcode::Create => Body::new().push(&CreateIn {
            flags: libc::O_RDWR as u32,
            mode: libc::S_IFREG | mode,
            umask: 0,
            open_flags: 0,
        }),
        _ => unreachable!(),
    };
    let ext = groups.map(encode::groups_ext).unwrap_or_default();
    let out = match op {
        Opcode::Create => std::mem::size_of::<EntryOut>() + std::mem::size_of::<OpenOut>(),
        _ => std::mem::size_of::<EntryOut>(),
    };
    let mut args = Args::new(op, parent)
        .body(body.cstr(name).bytes(&ext).into_vec())
        .out(out, false)
        .creds(ME, ME, 1);
    args.total_extlen = (ext.len() / 8) as u16;
    let r = c.chan().send(args)?;
    let (e, rest) = EntryOut::read_from_prefix(&r.data).map_err(|_| Errno::EPROTO)?;
    if op == Opcode::Create {
        let (o, _) = OpenOut::read_from_prefix(rest).map_err(|_| Errno::EPROTO)?;
        c.release(e.nodeid, o.fh, 0)?;
    }
    Ok(())
}

/// Two directories of root's whose group is [`TEAM`], both setgid: `team`
/// (02770: only the group may enter) and `open` (02777).
fn team_dirs(m: &Mount) -> (u64, u64) {
    for (name, mode) in [("team", 0o2770), ("open", 0o2777)] {
        std::fs::create_dir(m.path(name)).unwrap();
        chown(&m.path(name), 0, TEAM);
        set_mode(&m.path(name), mode);
    }
    let node = |n: &[u8]| m.client.lookup(ROOT_ID, n).unwrap().nodeid;
    (node(b"team"), node(b"open"))
}

#[test]
fn a_creating_request_is_a_member_of_the_parents_group_it_names() {
    // Guest group 5 is host TEAM.
    let gids = IdMap::new(&[
        "guest:5:65531:1".parse::<IdMapping>().unwrap(),
        "forbid-guest:66666:1".parse().unwrap(),
    ])
    .unwrap();
    let m = served(Groups::None, gids, init::CREATE_SUPP_GROUP);
    let n = m.client.chan().negotiated().unwrap();
    assert_ne!(n.flags & init::CREATE_SUPP_GROUP, 0, "negotiated");
    let (team, open) = team_dirs(&m);
    let c = &m.client;
    // A directory only the group may write: made, with its group and
    // setgid.
    make(c, Opcode::Mkdir, team, b"d", 0o755, Some(&[5])).unwrap();
    assert_eq!(owner(&m.path("team/d")), (ME, TEAM));
    assert_eq!(mode(&m.path("team/d")), 0o2755);
    assert_eq!(
        make(c, Opcode::Mkdir, team, b"e", 0o755, None),
        Err(Errno(libc::EACCES)),
        "not a member without the extension"
    );
    // A setgid, group-executable file in a setgid directory of the
    // caller's group keeps its setgid bit; without the extension the
    // host strips it.
    make(c, Opcode::Create, open, b"f", 0o2755, Some(&[5])).unwrap();
    assert_eq!(owner(&m.path("open/f")), (ME, TEAM));
    assert_eq!(mode(&m.path("open/f")), 0o2755);
    make(c, Opcode::Create, open, b"g", 0o2755, None).unwrap();
    assert_eq!(mode(&m.path("open/g")), 0o755);
    // A forbidden group: nothing made.
    assert_eq!(
        make(c, Opcode::Mkdir, open, b"h", 0o755, Some(&[66666])),
        Err(Errno::EPERM)
    );
    assert!(!m.path("open/h").exists());
    // A malformed extension (two groups claimed, one sent): EINVAL,
    // nothing made, and serving goes on.
    let mut bad = encode::groups_ext(&[5]);
    bad[8] = 2;
    let mut args = Args::new(Opcode::Mkdir, open)
        .body(
            Body::new()
                .push(&MkdirIn {
                    mode: 0o755,
                    umask: 0,
                })
                .cstr(b"i")
                .bytes(&bad)
                .into_vec(),
        )
        .out(std::mem::size_of::<EntryOut>(), false)
        .creds(ME, ME, 1);
    args.total_extlen = (bad.len() / 8) as u16;
    assert_eq!(c.chan().send(args).unwrap_err(), Errno::EINVAL);
    assert!(!m.path("open/i").exists());
    make(c, Opcode::Mkdir, open, b"j", 0o755, Some(&[5])).unwrap();
}

#[test]
fn groups_a_client_did_not_negotiate_are_not_taken() {
    let m = served(Groups::None, IdMap::default(), 0);
    let n = m.client.chan().negotiated().unwrap();
    assert_eq!(n.flags & init::CREATE_SUPP_GROUP, 0);
    let (team, _) = team_dirs(&m);
    assert_eq!(
        make(&m.client, Opcode::Mkdir, team, b"d", 0o755, Some(&[TEAM])),
        Err(Errno(libc::EACCES))
    );
}

#[test]
fn setgid_stays_off_a_group_no_guest_gid_reaches() {
    // The owner's setgid bit is kept only where the guest could act as
    // the file's group itself: never a forbidden host gid, or one no
    // guest gid translates to (host uid 65534 could not make a file of
    // group root setgid either).
    for map in ["forbid-guest:0:1", "squash-guest:0:65534:1"] {
        let gids = IdMap::new(&[map.parse::<IdMapping>().unwrap()]).unwrap();
        let m = served(Groups::None, gids, 0);
        let me = m.client.as_user(ME, ME);
        std::fs::write(m.path("f"), b"x").unwrap();
        chown(&m.path("f"), ME, 0);
        set_mode(&m.path("f"), 0o755);
        // Looked up by the owner (a guest whose gid 0 is forbidden acts
        // as nothing with it).
        let f = me.lookup(ROOT_ID, b"f").unwrap().nodeid;
        chmod(&me, f, 0o2755).unwrap();
        assert_eq!(mode(&m.path("f")), 0o755, "{map}: setgid on host group 0");
    }
}

#[test]
fn a_renamed_capability_goes_after_a_setattr_by_a_caller_without_capabilities() {
    // The host removes a real security.capability when a file is written
    // to, truncated or chowned; the daemon removes the renamed one, with
    // its own credentials (the caller may not write trusted.*).
    const CAPS: &[u8] = b"trusted.virtiofs.security.capability";
    let uids = IdMap::new(&["squash-guest:0:65534:1".parse::<IdMapping>().unwrap()]).unwrap();
    let host = HostDir::new(Kind::Tmpfs);
    let share = host.path.clone();
    let cfg = Config {
        xattr: true,
        xattrmap: Some(":map::trusted.virtiofs.:".parse().unwrap()),
        groups: Groups::None,
        translate_uid: uids,
        ..Config::default()
    };
    let m = Mount::offering(host, &share, cfg, Via::Device(2), 0, 0).unwrap();
    let f = file(&m, "prog", ME, ME);
    let p = m.path("prog");
    // The guest's root (host uid 65534) truncates its own file.
    host_setxattr(&p, CAPS, b"caps");
    let size = SetattrIn {
        valid: fattr::SIZE,
        size: 0,
        ..Default::default()
    };
    m.client.setattr(f, &size).unwrap();
    assert_eq!(host_xattr(&p, CAPS), None, "kept after a truncate");
    // Its owner, a guest user, chowns it to itself.
    host_setxattr(&p, CAPS, b"caps");
    let me = m.client.as_user(ME, ME);
    assert_eq!(set_ids(&me, f, Some(ME), Some(ME)), Ok((ME, ME)));
    assert_eq!(host_xattr(&p, CAPS), None, "kept after a chown");
}
