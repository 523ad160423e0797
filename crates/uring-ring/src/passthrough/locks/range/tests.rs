//! [`Span`] conversions at the extremes.

use super::*;

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
