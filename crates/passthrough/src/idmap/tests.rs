//! [`IdMapping`]'s syntax (virtiofsd's), [`IdMap`]'s translation and
//! range checks at the edges, against a brute-force model, and ACL values.

use super::*;
use proptest::prelude::*;

fn parse(s: &str) -> Result<IdMapping, IdMapError> {
    s.parse()
}

fn map(specs: &[&str]) -> Result<IdMap, IdMapError> {
    let m: Vec<IdMapping> = specs.iter().map(|s| parse(s).unwrap()).collect();
    IdMap::new(&m)
}

#[test]
fn every_type_parses_with_its_fields_in_virtiofsds_order() {
    assert_eq!(
        parse("guest:0:1000:10"),
        Ok(IdMapping::Guest {
            guest: 0,
            host: 1000,
            count: 10
        })
    );
    assert_eq!(
        parse("host:1000:0:10"),
        Ok(IdMapping::Host {
            host: 1000,
            guest: 0,
            count: 10
        })
    );
    assert_eq!(
        parse("squash-guest:100:65534:50"),
        Ok(IdMapping::SquashGuest {
            guest: 100,
            host: 65534,
            count: 50
        })
    );
    assert_eq!(
        parse("squash-host:100:65534:50"),
        Ok(IdMapping::SquashHost {
            host: 100,
            guest: 65534,
            count: 50
        })
    );
    assert_eq!(
        parse("forbid-guest:5:2"),
        Ok(IdMapping::ForbidGuest { guest: 5, count: 2 })
    );
    assert_eq!(
        parse("map:0:100000:65536"),
        Ok(IdMapping::Map {
            guest: 0,
            host: 100000,
            count: 65536
        })
    );
    for s in [
        "guest:0:1000:10",
        "host:1000:0:10",
        "squash-guest:1:2:3",
        "squash-host:1:2:3",
        "forbid-guest:5:2",
        "map:0:100000:65536",
    ] {
        assert_eq!(parse(s).unwrap().to_string(), s, "round trip");
    }
}

#[test]
fn the_type_is_read_in_any_case_and_any_separator_works() {
    // As virtiofsd: the first character after the type separates.
    let want = IdMapping::Map {
        guest: 1,
        host: 2,
        count: 3,
    };
    for s in [
        "MAP:1:2:3",
        "Map/1/2/3",
        "map,1,2,3",
        "map 1 2 3",
        "map+1+2+3",
    ] {
        assert_eq!(parse(s), Ok(want), "{s}");
    }
    // Rust's integer syntax: a leading + is taken.
    assert_eq!(parse("map:+1:2:3"), Ok(want));
    assert_eq!(parse("SQUASH-GUEST.0.1.2").unwrap().kind(), "squash-guest");
}

#[test]
fn malformed_mappings_are_errors() {
    assert!(matches!(parse(""), Err(IdMapError::NoNumbers(_))));
    assert!(matches!(parse("guest"), Err(IdMapError::NoNumbers(_))));
    assert!(matches!(
        parse("squash_guest:0:1:2"),
        Err(IdMapError::UnknownType(t)) if t == "squash_guest"
    ));
    assert!(matches!(parse(":0:1:2"), Err(IdMapError::UnknownType(t)) if t.is_empty()));
    assert!(matches!(
        parse("uid:0:1:2"),
        Err(IdMapError::UnknownType(_))
    ));
    assert_eq!(
        parse("guest:0:1"),
        Err(IdMapError::Numbers {
            kind: "guest",
            expected: 3,
            given: 2
        })
    );
    assert_eq!(
        parse("forbid-guest:0:1:2"),
        Err(IdMapError::Numbers {
            kind: "forbid-guest",
            expected: 2,
            given: 3
        })
    );
    for bad in [
        "guest:",
        "guest:0:1:2:",
        "guest::1:2",
        "guest:0:1:-1",
        "guest:0:1:4294967296",
        "guest:0:1:0x10",
        "guest:0;1;2",
        "guest: 0:1:2",
    ] {
        assert!(
            matches!(parse(bad), Err(IdMapError::NotANumber { .. })),
            "{bad}: {:?}",
            parse(bad)
        );
    }
    // The cause is kept.
    let e = parse("guest:0:1:x").unwrap_err();
    assert!(std::error::Error::source(&e).is_some());
}

#[test]
fn nothing_configured_translates_nothing() {
    let m = IdMap::default();
    assert!(m.is_identity());
    for id in [0, 1, 1000, u32::MAX - 1, u32::MAX] {
        assert_eq!(m.to_host(id), Ok(id));
        assert_eq!(m.to_guest(id), id);
    }
}

#[test]
fn guest_and_host_translate_one_way_each_and_map_both() {
    let m = map(&["guest:0:1000:10"]).unwrap();
    assert!(!m.is_identity());
    assert_eq!(m.to_host(0), Ok(1000));
    assert_eq!(m.to_host(9), Ok(1009));
    assert_eq!(m.to_host(10), Ok(10), "past the range: unchanged");
    assert_eq!(m.to_guest(1000), 1000, "no host to guest rule");

    let m = map(&["host:1000:0:10"]).unwrap();
    assert_eq!(m.to_guest(1005), 5);
    assert_eq!(m.to_host(5), Ok(5), "no guest to host rule");

    let m = map(&["map:0:1000:10"]).unwrap();
    assert_eq!(m.to_host(3), Ok(1003));
    assert_eq!(m.to_guest(1003), 3);
    assert_eq!(m.to_guest(3), 3);
    assert_eq!(m.to_host(1003), Ok(1003));
}

#[test]
fn squash_folds_a_range_into_one_id_and_forbid_refuses_it() {
    let m = map(&["squash-guest:100:65534:50", "forbid-guest:0:1"]).unwrap();
    assert_eq!(m.to_host(99), Ok(99));
    assert_eq!(m.to_host(100), Ok(65534));
    assert_eq!(m.to_host(149), Ok(65534));
    assert_eq!(m.to_host(150), Ok(150));
    assert_eq!(m.to_host(0), Err(Forbidden(0)));
    assert_eq!(m.to_host(1), Ok(1));
    assert_eq!(Errno::from(Forbidden(0)), Errno::EPERM);

    let m = map(&["squash-host:0:65534:1000"]).unwrap();
    assert_eq!(m.to_guest(0), 65534);
    assert_eq!(m.to_guest(999), 65534);
    assert_eq!(m.to_guest(1000), 1000);
}

#[test]
fn overlaps_in_one_direction_are_errors_and_across_directions_are_not() {
    // The guest side of map against a guest mapping.
    let e = map(&["guest:0:1000:10", "map:9:2000:5"]).unwrap_err();
    assert!(
        matches!(
            e,
            IdMapError::Overlap {
                direction: "guest to host",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "map:9:2000:5 overlaps guest:0:1000:10 (guest to host)"
    );
    // The host side of map against a host mapping.
    assert!(matches!(
        map(&["host:2000:0:10", "map:500:2005:1"]),
        Err(IdMapError::Overlap {
            direction: "host to guest",
            ..
        })
    ));
    // forbid and squash against each other.
    assert!(map(&["forbid-guest:5:1", "squash-guest:0:1:10"]).is_err());
    // A range covering several earlier ones, before, between and after.
    assert!(map(&["guest:10:0:5", "guest:20:0:5", "guest:0:0:100"]).is_err());
    assert!(map(&["guest:10:0:5", "guest:20:0:5", "guest:16:0:5"]).is_err());
    assert!(map(&["guest:10:0:5", "guest:20:0:5", "guest:12:0:1"]).is_err());
    assert!(map(&["guest:10:0:5", "guest:20:0:5", "guest:24:0:100"]).is_err());
    // Adjacent is not overlapping.
    let m = map(&[
        "guest:10:0:5",
        "guest:20:0:5",
        "guest:15:100:5",
        "guest:0:200:10",
    ])
    .unwrap();
    assert_eq!(m.to_host(15), Ok(100));
    assert_eq!(m.to_host(9), Ok(209));
    assert_eq!(m.to_host(25), Ok(25));
    // The same IDs in both directions.
    let m = map(&["guest:0:1000:10", "host:0:1000:10"]).unwrap();
    assert_eq!(m.to_host(0), Ok(1000));
    assert_eq!(m.to_guest(0), 1000);
    // Targets may overlap (squashing is many to one anyway).
    assert!(map(&["guest:0:1000:10", "guest:100:1000:10"]).is_ok());
}

#[test]
fn ranges_reach_4294967294_and_never_4294967295() {
    let top = u32::MAX - 1;
    // The last ID a range can hold.
    let m = map(&["map:4294967294:0:1"]).unwrap();
    assert_eq!(m.to_host(top), Ok(0));
    assert_eq!(m.to_guest(0), top);
    assert_eq!(m.to_host(u32::MAX), Ok(u32::MAX));
    let m = map(&["forbid-guest:0:4294967295"]).unwrap();
    assert_eq!(m.to_host(top), Err(Forbidden(top)));
    assert_eq!(m.to_host(u32::MAX), Ok(u32::MAX), "-1 is never forbidden");
    // Past it: the source range, the target range, a squash target.
    for (s, side) in [
        ("guest:4294967295:0:1", "guest"),
        ("guest:1:0:4294967295", "guest"),
        ("guest:0:4294967295:1", "host"),
        ("guest:0:4294967200:200", "host"),
        ("host:4294967295:0:1", "host"),
        ("host:0:4294967295:1", "guest"),
        ("map:0:4294967295:1", "host"),
        ("map:4294967295:0:1", "guest"),
        ("forbid-guest:4294967295:1", "guest"),
        ("forbid-guest:4294967295:4294967295", "guest"),
        ("squash-guest:0:4294967295:1", "host"),
        ("squash-host:0:4294967295:1", "guest"),
        ("squash-host:4294967290:0:6", "host"),
    ] {
        match map(&[s]) {
            Err(IdMapError::TooHigh { side: got, .. }) => assert_eq!(got, side, "{s}"),
            other => panic!("{s}: {other:?}"),
        }
    }
    // Empty ranges are taken and do nothing, wherever they start.
    for s in [
        "guest:4294967295:0:0",
        "map:0:0:0",
        "forbid-guest:4294967295:0",
    ] {
        assert!(map(&[s]).unwrap().is_identity(), "{s}");
    }
    // And overlap nothing.
    assert!(map(&["guest:0:100:10", "guest:5:100:0"]).is_ok());
}

/// What a list of mappings means, ID by ID (a slow model).
fn model(ms: &[IdMapping], id: u32, guest: bool) -> Option<Result<u32, ()>> {
    let within = |b: u32, c: u32| id >= b && u64::from(id) < u64::from(b) + u64::from(c);
    let mut hits = ms.iter().filter_map(|m| match (*m, guest) {
        (IdMapping::Guest { guest, host, count }, true)
        | (IdMapping::Map { guest, host, count }, true)
        | (
            IdMapping::Host {
                host: guest,
                guest: host,
                count,
            },
            false,
        )
        | (
            IdMapping::Map {
                host: guest,
                guest: host,
                count,
            },
            false,
        ) if within(guest, count) => Some(Ok(host + (id - guest))),
        (IdMapping::SquashGuest { guest, host, count }, true)
        | (
            IdMapping::SquashHost {
                host: guest,
                guest: host,
                count,
            },
            false,
        ) if within(guest, count) => Some(Ok(host)),
        (IdMapping::ForbidGuest { guest, count }, true) if within(guest, count) => Some(Err(())),
        _ => None,
    });
    let first = hits.next();
    // Two rules for one ID in one direction: the list must be refused.
    hits.next().map_or(first, |_| None)
}

fn mapping() -> impl Strategy<Value = IdMapping> {
    let id = 0u32..48;
    let count = 0u32..12;
    (0u8..6, id.clone(), id, count).prop_map(|(k, a, b, count)| match k {
        0 => IdMapping::Guest {
            guest: a,
            host: b,
            count,
        },
        1 => IdMapping::Host {
            host: a,
            guest: b,
            count,
        },
        2 => IdMapping::SquashGuest {
            guest: a,
            host: b,
            count,
        },
        3 => IdMapping::SquashHost {
            host: a,
            guest: b,
            count,
        },
        4 => IdMapping::ForbidGuest { guest: a, count },
        _ => IdMapping::Map {
            guest: a,
            host: b,
            count,
        },
    })
}

proptest! {
    #[test]
    fn translation_agrees_with_the_model(ms in prop::collection::vec(mapping(), 0..6)) {
        let ids = 0u32..64;
        // The list is refused exactly when some ID has two rules in one
        // direction (nothing here reaches 4294967295).
        let ambiguous = ids.clone().any(|id| {
            [true, false].into_iter().any(|g| {
                let mut n = 0;
                for m in &ms {
                    if model(std::slice::from_ref(m), id, g).is_some() {
                        n += 1;
                    }
                }
                n > 1
            })
        });
        let built = IdMap::new(&ms);
        prop_assert_eq!(built.is_err(), ambiguous, "{:?}", built);
        let Ok(m) = built else { return Ok(()) };
        for id in ids {
            let want_host = model(&ms, id, true).unwrap_or(Ok(id));
            prop_assert_eq!(m.to_host(id).map_err(|Forbidden(_)| ()), want_host, "to_host({})", id);
            let want_guest = model(&ms, id, false).unwrap_or(Ok(id));
            prop_assert_eq!(Ok(m.to_guest(id)), want_guest, "to_guest({})", id);
        }
    }

    #[test]
    fn any_string_parses_or_errs_without_panicking(s in ".{0,40}") {
        let _ = s.parse::<IdMapping>();
    }
}

fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

const USER_OBJ: u16 = 0x01;
const GROUP_OBJ: u16 = 0x04;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
const NONE: u32 = u32::MAX;

#[test]
fn acl_user_and_group_entries_are_translated_both_ways() {
    let uids = map(&["map:0:1000:10", "forbid-guest:66:1"]).unwrap();
    let gids = map(&["map:0:2000:10"]).unwrap();
    let guest = acl(&[
        (USER_OBJ, 6, NONE),
        (ACL_USER, 4, 3),
        (ACL_USER, 4, 50),
        (GROUP_OBJ, 4, NONE),
        (ACL_GROUP, 4, 3),
        (MASK, 4, NONE),
        (OTHER, 0, NONE),
    ]);
    let host = acl(&[
        (USER_OBJ, 6, NONE),
        (ACL_USER, 4, 1003),
        (ACL_USER, 4, 50),
        (GROUP_OBJ, 4, NONE),
        (ACL_GROUP, 4, 2003),
        (MASK, 4, NONE),
        (OTHER, 0, NONE),
    ]);
    let mut v = guest.clone();
    acl_to_host(&mut v, &uids, &gids).unwrap();
    assert_eq!(v, host);
    acl_to_guest(&mut v, &uids, &gids);
    assert_eq!(v, guest);
    // Entries without an ID keep what they carry, even an ID the map
    // would translate.
    let mut v = acl(&[(USER_OBJ, 6, 0), (OTHER, 0, 5)]);
    let before = v.clone();
    acl_to_host(&mut v, &uids, &gids).unwrap();
    assert_eq!(v, before);
    // A forbidden ID is refused.
    let mut v = acl(&[(USER_OBJ, 6, NONE), (ACL_USER, 4, 66)]);
    assert_eq!(acl_to_host(&mut v, &uids, &gids), Err(Forbidden(66)));
}

#[test]
fn values_that_are_no_acl_are_left_alone() {
    let uids = map(&["map:0:1000:10"]).unwrap();
    let gids = IdMap::default();
    let good = acl(&[(ACL_USER, 4, 1)]);
    let mut version3 = good.clone();
    version3[0] = 3;
    for v in [
        Vec::new(),
        vec![2, 0, 0],
        good[..good.len() - 1].to_vec(),
        version3,
    ] {
        let mut w = v.clone();
        acl_to_host(&mut w, &uids, &gids).unwrap();
        acl_to_guest(&mut w, &uids, &gids);
        assert_eq!(w, v);
    }
}
