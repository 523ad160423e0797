//! Fault injection (`server::faults::Faulty`) through the whole engine:
//! plans parse and repeat from their seed; an injected error reaches the
//! caller while other calls go on; short reads and writes reach the caller
//! as short counts; a hang ends in the engine's timeout (connection abort,
//! the kernel's rule) and does not hold up other requests meanwhile.

use fuse_core::abi::{Opcode, ROOT_ID};
use fuse_core::embedded::{Embedded, Options};
use fuse_core::server::faults::{Fault, FaultPlan, Faulty, PlanError};
use fuse_core::testing::memfs::MemFs;
use fuse_core::Errno;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

fn start(spec: &str, opts: Options) -> Embedded<Faulty<MemFs>> {
    let plan = FaultPlan::parse(spec, 7).unwrap();
    Embedded::start(Faulty::new(MemFs::new(), plan), opts).unwrap()
}

#[test]
fn plans_parse_and_refuse_what_they_do_not_understand() {
    let p = FaultPlan::parse(
        "read:error=EIO:p=0.25, write:short, getattr:hang:after=3, *:delay=5ms",
        1,
    )
    .unwrap();
    assert_eq!(p.rules.len(), 4);
    assert_eq!(p.rules[0].op, Some(Opcode::Read));
    assert_eq!(p.rules[0].fault, Fault::Error(Errno::EIO));
    assert_eq!(p.rules[0].p, 0.25);
    assert_eq!(p.rules[1].fault, Fault::Short);
    assert_eq!((p.rules[2].fault, p.rules[2].after), (Fault::Hang, 3));
    assert_eq!(p.rules[3].op, None);
    assert_eq!(p.rules[3].fault, Fault::Delay(Duration::from_millis(5)));
    assert_eq!(
        FaultPlan::parse("rread:hang", 0),
        Err(PlanError::Op("rread".into()))
    );
    assert_eq!(
        FaultPlan::parse("read:p=2:hang", 0),
        Err(PlanError::Field("p=2".into()))
    );
    assert!(matches!(
        FaultPlan::parse("read:p=0.5", 0),
        Err(PlanError::NoFault(_))
    ));
    assert_eq!(
        FaultPlan::parse("copy_file_range:error=28", 0)
            .unwrap()
            .rules[0]
            .op,
        Some(Opcode::CopyFileRange)
    );
}

#[test]
fn an_injected_error_reaches_the_caller_and_repeats_from_the_seed() {
    let fs = start("getattr:error=EIO:p=0.3", Options::default());
    let c = fs.client();
    let results: Vec<_> = (0..200).map(|_| c.getattr(ROOT_ID, None)).collect();
    let failed = results.iter().filter(|r| r.is_err()).count();
    assert!(results
        .iter()
        .all(|r| r.is_ok() || *r.as_ref().unwrap_err() == Errno::EIO));
    assert!((30..90).contains(&failed), "{failed} of 200 failed");
    assert_eq!(
        fs.fs().counts().errors.load(Ordering::SeqCst),
        failed as u64
    );
    // Other operations are untouched.
    assert_eq!(
        c.lookup(ROOT_ID, b"nope").unwrap_err(),
        Errno::ENOENT,
        "lookup is not in the plan"
    );
    // The same seed draws the same failures (one caller, so one order).
    let pattern = |spec| {
        let fs = start(spec, Options::default());
        let c = fs.client();
        (0..100)
            .map(|_| c.getattr(ROOT_ID, None).is_err())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        pattern("getattr:error=EIO:p=0.3"),
        pattern("getattr:error=EIO:p=0.3")
    );
}

#[test]
fn short_reads_and_writes_reach_the_caller() {
    let fs = start(
        "write:short:after=1, read:short:after=1",
        Options::default(),
    );
    let c = fs.client();
    let (e, o) = c
        .create(ROOT_ID, b"f", 0o100_644, 2 /* O_RDWR */, 0)
        .unwrap();
    let data = vec![7u8; 8192];
    // The first write and read pass (after=1), the next are cut short.
    assert_eq!(c.write(e.nodeid, o.fh, 0, &data, 0).unwrap(), 8192);
    assert_eq!(c.read(e.nodeid, o.fh, 0, 8192).unwrap().len(), 8192);
    let n = c.write(e.nodeid, o.fh, 8192, &data, 0).unwrap();
    assert!((1..8192).contains(&n), "short write: {n}");
    let got = c.read(e.nodeid, o.fh, 0, 8192).unwrap();
    assert!(
        !got.is_empty() && got.len() < 8192,
        "short read: {}",
        got.len()
    );
    assert!(got.iter().all(|&b| b == 7));
    assert_eq!(fs.fs().counts().shorts.load(Ordering::SeqCst), 2);
}

#[test]
fn a_hang_ends_in_the_timeout_while_other_requests_are_served() {
    let fs = start(
        "read:hang",
        Options {
            request_timeout: Duration::from_secs(1),
            scan_period: Duration::from_millis(100),
            workers: 2,
            ..Options::default()
        },
    );
    let c = fs.client().clone();
    let (e, o) = c
        .create(ROOT_ID, b"f", 0o100_644, 2 /* O_RDWR */, 0)
        .unwrap();
    let c2 = c.clone();
    let start = Instant::now();
    let hung = std::thread::spawn(move || c2.read(e.nodeid, o.fh, 0, 100));
    // Meanwhile other requests are served.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(fs.fs().counts().hangs.load(Ordering::SeqCst), 1);
    assert!(c.getattr(e.nodeid, None).is_ok());
    // The hung read: the connection is aborted after the timeout (the
    // kernel's rule for a server that does not answer in time).
    assert_eq!(hung.join().unwrap().unwrap_err(), Errno::ENOTCONN);
    let took = start.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(4),
        "{took:?}"
    );
    assert!(fs.chan().stats().timeouts_fired >= 1);
    assert_eq!(c.getattr(ROOT_ID, None).unwrap_err(), Errno::ENOTCONN);
    fs.fs().release_hangs();
}

#[test]
fn an_interrupt_ends_a_hang() {
    let fs = start("read:hang", Options::default());
    let c = fs.client().clone();
    let (e, o) = c
        .create(ROOT_ID, b"f", 0o100_644, 2 /* O_RDWR */, 0)
        .unwrap();
    let call = c.chan().call(
        fuse_core::Args::new(Opcode::Read, e.nodeid)
            .body(
                zerocopy::IntoBytes::as_bytes(&fuse_core::abi::ReadIn {
                    fh: o.fh,
                    size: 100,
                    ..Default::default()
                })
                .to_vec(),
            )
            .out(100, true),
    );
    let sig = call.signal();
    let t = std::thread::spawn(move || call.wait());
    let t0 = Instant::now();
    while fs.fs().counts().hangs.load(Ordering::SeqCst) == 0 {
        assert!(t0.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(5));
    }
    sig.interrupt();
    assert_eq!(t.join().unwrap().unwrap_err(), Errno::EINTR);
    assert_eq!(fs.fs().counts().hangs_interrupted.load(Ordering::SeqCst), 1);
    // The connection is fine.
    assert!(c.getattr(ROOT_ID, None).is_ok());
}

#[test]
fn times_limits_a_rule_and_gather_holds_calls_until_enough_are_held() {
    use fuse_core::server::{Ctx, Filesystem};
    use std::sync::Arc;
    let p = FaultPlan::parse("read:gather=16:times=2", 0).unwrap();
    assert_eq!(p.rules[0].fault, Fault::Gather(16));
    assert_eq!(p.rules[0].times, Some(2));
    assert!(FaultPlan::parse("read:gather=0", 0).is_err());

    let plan = FaultPlan::parse("getattr:error=EIO:times=2", 0).unwrap();
    let fs = Faulty::new(MemFs::new(), plan);
    let ctx = Ctx::default();
    let errs: Vec<bool> = (0..5)
        .map(|_| fs.getattr(&ctx, ROOT_ID, None).is_err())
        .collect();
    assert_eq!(errs, [true, true, false, false, false]);

    // Three calls go on together once the third is held; a fourth alone
    // waits until released.
    let plan = FaultPlan::parse("getattr:gather=3", 0).unwrap();
    let fs = Arc::new(Faulty::new(MemFs::new(), plan));
    let call = |fs: &Arc<Faulty<MemFs>>| {
        let fs = fs.clone();
        std::thread::spawn(move || fs.getattr(&Ctx::default(), ROOT_ID, None).is_ok())
    };
    let first: Vec<_> = (0..2).map(|_| call(&fs)).collect();
    std::thread::sleep(Duration::from_millis(100));
    assert!(first.iter().all(|t| !t.is_finished()));
    let third = call(&fs);
    for t in first.into_iter().chain([third]) {
        assert!(t.join().unwrap());
    }
    let alone = call(&fs);
    std::thread::sleep(Duration::from_millis(100));
    assert!(!alone.is_finished());
    fs.release_hangs();
    assert!(alone.join().unwrap());
}
