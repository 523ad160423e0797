//! [`RangeSet`] against a byte-map model and against the kernel's own
//! bookkeeping of one description's read locks; [`Span`] conversions at
//! the extremes.

use super::*;
use host_io::sys;
use proptest::prelude::*;
use std::os::fd::AsRawFd;

fn set(ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut s = RangeSet::default();
    for &(a, b) in ranges {
        s.insert(a, b);
    }
    s.iter().collect()
}

#[test]
fn overlapping_and_adjacent_ranges_merge() {
    assert_eq!(set(&[(0, 9), (10, 19)]), [(0, 19)]);
    assert_eq!(set(&[(10, 19), (0, 9)]), [(0, 19)]);
    assert_eq!(set(&[(0, 9), (11, 19)]), [(0, 9), (11, 19)]);
    assert_eq!(set(&[(0, 9), (20, 29), (5, 22)]), [(0, 29)]);
    assert_eq!(set(&[(5, 6), (0, 100)]), [(0, 100)]);
    assert_eq!(set(&[(0, 100), (5, 6)]), [(0, 100)]);
    assert_eq!(
        set(&[(OFFSET_MAX, OFFSET_MAX), (0, OFFSET_MAX - 1)]),
        [(0, OFFSET_MAX)]
    );
}

#[test]
fn unlocking_a_part_splits_or_trims() {
    let mut s = RangeSet::default();
    s.insert(0, OFFSET_MAX);
    s.remove(10, 19);
    assert_eq!(s.iter().collect::<Vec<_>>(), [(0, 9), (20, OFFSET_MAX)]);
    s.remove(0, 0);
    s.remove(OFFSET_MAX, OFFSET_MAX);
    assert_eq!(s.iter().collect::<Vec<_>>(), [(1, 9), (20, OFFSET_MAX - 1)]);
    s.remove(5, 25);
    assert_eq!(s.iter().collect::<Vec<_>>(), [(1, 4), (26, OFFSET_MAX - 1)]);
    s.remove(0, OFFSET_MAX);
    assert!(s.is_empty());
}

#[test]
fn spans_refuse_what_the_kernel_refuses() {
    let l = |typ: i32, start, end| FileLock {
        start,
        end,
        typ: typ as u32,
        pid: 0,
    };
    let rd = libc::F_RDLCK;
    for (start, end) in [
        (1, 0),
        (1 << 63, 5),
        (1 << 63, (1 << 63) + 5),
        (0, u64::MAX),
        (u64::MAX, u64::MAX),
        (OFFSET_MAX, OFFSET_MAX + 1),
    ] {
        assert_eq!(Span::of_client(&l(rd, start, end)), Err(Errno::EINVAL));
    }
    assert_eq!(Span::of_client(&l(3, 0, 0)), Err(Errno::EINVAL));
    assert_eq!(
        Span::of_client(&FileLock {
            typ: 0x1_0001,
            ..l(0, 0, 0)
        }),
        Err(Errno::EINVAL),
        "a type that only truncates to F_WRLCK"
    );
    // The whole range and the last byte convert both ways.
    for (start, end) in [(0, OFFSET_MAX), (OFFSET_MAX, OFFSET_MAX), (0, 0), (7, 9)] {
        let s = Span::of_client(&l(rd, start, end)).unwrap();
        assert_eq!(Span::of_flock(&s.flock()), Some(s));
    }
    let f = Span::of_client(&l(rd, OFFSET_MAX, OFFSET_MAX))
        .unwrap()
        .flock();
    assert_eq!((f.l_start, f.l_len), (i64::MAX, 0));
}

#[test]
fn flocks_out_of_range_are_none() {
    let f = |start, len| {
        let mut f = Span {
            typ: libc::F_RDLCK,
            start: 0,
            end: 0,
        }
        .flock();
        f.l_start = start;
        f.l_len = len;
        Span::of_flock(&f)
    };
    assert_eq!(f(i64::MAX, 2), None);
    assert_eq!(f(-1, 1), None);
    assert_eq!(f(0, -1), None);
    assert_eq!(f(i64::MIN, -1), None);
    assert_eq!(f(10, -3).map(|s| (s.start, s.end)), Some((7, 9)));
    assert_eq!(
        f(i64::MAX, 1).map(|s| (s.start, s.end)),
        Some((OFFSET_MAX, OFFSET_MAX))
    );
}

/// Operations: read-lock (true) or unlock a range of 0..64.
fn ops() -> impl Strategy<Value = Vec<(bool, u64, u64)>> {
    prop::collection::vec(
        (any::<bool>(), 0u64..64, 0u64..64).prop_map(|(lock, a, b)| (lock, a.min(b), a.max(b))),
        0..40,
    )
}

/// The runs of set bits of a 64-byte model starting at `base`.
fn runs(model: &[bool; 64], base: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < 64 {
        if model[i] {
            let s = i;
            while i < 64 && model[i] {
                i += 1;
            }
            out.push((base + s as u64, base + i as u64 - 1));
        } else {
            i += 1;
        }
    }
    out
}

/// The read locks the kernel holds for `holder`, as seen from `other` (a
/// description of the same file): F_OFD_GETLK from `other` reports them
/// one after the other, lowest first.
fn kernel_ranges(other: &std::fs::File) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut pos = 0u64;
    loop {
        let mut f = Span {
            typ: libc::F_WRLCK,
            start: pos,
            end: OFFSET_MAX,
        }
        .flock();
        let r = sys::fcntl_lock(other.as_raw_fd(), libc::F_OFD_GETLK, &mut f);
        assert_eq!(r, Ok(()));
        if f.l_type == libc::F_UNLCK as libc::c_short {
            return out;
        }
        let s = Span::of_flock(&f).unwrap();
        out.push((s.start, s.end));
        if s.end == OFFSET_MAX {
            return out;
        }
        pos = s.end + 1;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn range_set_matches_a_byte_model(
        base in prop::sample::select(vec![0, 1 << 40, OFFSET_MAX - 63]),
        ops in ops(),
    ) {
        let mut s = RangeSet::default();
        let mut model = [false; 64];
        for (lock, a, b) in ops {
            if lock {
                s.insert(base + a, base + b);
            } else {
                s.remove(base + a, base + b);
            }
            for bit in &mut model[a as usize..=b as usize] {
                *bit = lock;
            }
            prop_assert_eq!(s.iter().collect::<Vec<_>>(), runs(&model, base));
        }
    }

    #[test]
    fn range_set_matches_the_kernels_locks(
        ops in prop::collection::vec(
            (any::<bool>(), prop::sample::select(vec![0u64, 1, 2, 9, 10, 11, 100, OFFSET_MAX - 1, OFFSET_MAX]),
             prop::sample::select(vec![0u64, 1, 2, 9, 10, 11, 100, OFFSET_MAX - 1, OFFSET_MAX])),
            0..30,
        ),
    ) {
        let path = std::env::temp_dir().join(format!(
            "fusebox-rangeset-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::write(&path, b"x").unwrap();
        let holder = std::fs::File::open(&path).unwrap();
        let other = std::fs::File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let mut s = RangeSet::default();
        for (lock, a, b) in ops {
            let span = Span {
                typ: if lock { libc::F_RDLCK } else { libc::F_UNLCK },
                start: a.min(b),
                end: a.max(b),
            };
            let mut f = span.flock();
            let r = sys::fcntl_lock(holder.as_raw_fd(), libc::F_OFD_SETLK, &mut f);
            prop_assert_eq!(r, Ok(()));
            s.apply(span);
            prop_assert_eq!(s.iter().collect::<Vec<_>>(), kernel_ranges(&other));
        }
    }
}
