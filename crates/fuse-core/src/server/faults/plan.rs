//! A [`FaultPlan`]: its rules, what each does, and parsing one from text
//! (the syntax is on the type). A plan is data only; [`super::Faulty`]
//! applies it.

use crate::abi::Opcode;
use crate::chan::Errno;
use std::time::Duration;
use thiserror::Error;

/// What a rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Sleep, then run the operation.
    Delay(Duration),
    /// Block until interrupted or released; then EINTR.
    Hang,
    /// Fail with this errno without running the operation.
    Error(Errno),
    /// READ/WRITE on part of the data only (other operations: no effect).
    Short,
    /// Held until this many calls are held at once.
    Gather(u32),
}

/// One rule of a [`FaultPlan`].
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Operations it applies to (None: all).
    pub op: Option<Opcode>,
    /// What it does.
    pub fault: Fault,
    /// Probability per matching call.
    pub p: f64,
    /// Matching calls to let through first.
    pub after: u64,
    /// Most times it applies (None: no limit).
    pub times: Option<u64>,
}

/// Why a plan does not parse.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PlanError {
    /// An operation name that is not a FUSE opcode.
    #[error("unknown operation {0:?} (a FUSE opcode name such as read, or *)")]
    Op(String),
    /// A field that is not understood.
    #[error("bad field {0:?} in fault rule")]
    Field(String),
    /// A count field whose value is not a number.
    #[error("bad count in field {field:?} of fault rule")]
    Count {
        /// The field.
        field: String,
        /// Why its value is not a count.
        #[source]
        source: std::num::ParseIntError,
    },
    /// A rule with no fault.
    #[error("rule {0:?} names no fault (delay=, hang, error=, short, gather=)")]
    NoFault(String),
}

/// Rules and a seed. A plan is a list of rules, each naming operations (by
/// FUSE opcode name, or `*` for all), what to do and how often:
///
/// ```text
/// read:error=EIO:p=0.1, write:short:p=0.5, getattr:hang:p=0.01, *:delay=5ms:p=0.2
/// ```
///
/// - `delay=DUR` sleeps (`5ms`, `2s`) and then runs the operation;
/// - `hang` blocks until the request is interrupted (FUSE_INTERRUPT, or the
///   virtio-fs device giving up on it after its timeout), or until
///   [`Faulty::release_hangs`](super::Faulty::release_hangs); then it
///   fails with EINTR;
/// - `error=ERRNO` fails without running the operation (a name such as
///   `EIO`, or a number);
/// - `short` runs a READ or WRITE on part of its data (a random length,
///   never 0): a short read or write reaches the caller;
/// - `gather=N` holds a call until N calls are held at once (all rules'
///   gathers together), then lets them all go on: N requests in flight at
///   once, or a hang for a server that cannot have that many (released
///   like a hang);
/// - `p=P` is the probability (default 1), `after=N` skips the first N
///   matching calls, `times=N` applies the rule at most N times.
///
/// The first rule whose operation matches and whose draw succeeds applies.
/// Draws come from one seeded generator, so a single-threaded run repeats
/// exactly; counters of every fault injected are kept per kind.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FaultPlan {
    /// Rules, first match wins.
    pub rules: Vec<Rule>,
    /// Seed of the draws.
    pub seed: u64,
}

impl FaultPlan {
    /// Parses comma-separated rules.
    pub fn parse(spec: &str, seed: u64) -> Result<FaultPlan, PlanError> {
        let mut rules = Vec::new();
        for r in spec.split(',').map(str::trim).filter(|r| !r.is_empty()) {
            let mut parts = r.split(':').map(str::trim);
            let op = match parts.next().unwrap_or("") {
                "*" => None,
                name => Some(opcode_named(name).ok_or_else(|| PlanError::Op(name.into()))?),
            };
            let (mut fault, mut p, mut after, mut times) = (None, 1.0, 0, None);
            for f in parts {
                let (k, v) = f.split_once('=').unwrap_or((f, ""));
                let bad = || PlanError::Field(f.into());
                let count = |source| PlanError::Count {
                    field: f.into(),
                    source,
                };
                match k {
                    "delay" => fault = Some(Fault::Delay(duration(v).ok_or_else(bad)?)),
                    "hang" => fault = Some(Fault::Hang),
                    "short" => fault = Some(Fault::Short),
                    "error" => fault = Some(Fault::Error(errno_named(v).ok_or_else(bad)?)),
                    "p" => {
                        p = v
                            .parse::<f64>()
                            .ok()
                            .filter(|p| (0.0..=1.0).contains(p))
                            .ok_or_else(bad)?
                    }
                    "after" => after = v.parse().map_err(count)?,
                    "times" => times = Some(v.parse().map_err(count)?),
                    "gather" => {
                        fault = Some(Fault::Gather(
                            v.parse().ok().filter(|n| *n > 0).ok_or_else(bad)?,
                        ))
                    }
                    _ => return Err(bad()),
                }
            }
            let fault = fault.ok_or_else(|| PlanError::NoFault(r.into()))?;
            rules.push(Rule {
                op,
                fault,
                p,
                after,
                times,
            });
        }
        Ok(FaultPlan { rules, seed })
    }
}

fn opcode_named(name: &str) -> Option<Opcode> {
    let want = name.to_ascii_lowercase().replace('_', "");
    (1..=64u32)
        .filter_map(Opcode::from_u32)
        .find(|o| format!("{o:?}").to_ascii_lowercase() == want)
}

fn errno_named(v: &str) -> Option<Errno> {
    if let Ok(n) = v.parse::<i32>() {
        return (n > 0 && n < 4096).then_some(Errno(n));
    }
    (1..134)
        .map(Errno)
        .find(|e| e.name().eq_ignore_ascii_case(v))
}

fn duration(v: &str) -> Option<Duration> {
    let (n, unit) = v
        .find(|c: char| !c.is_ascii_digit())
        .map_or((v, "ms"), |i| v.split_at(i));
    let n: u64 = n.parse().ok()?;
    match unit {
        "us" => Some(Duration::from_micros(n)),
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        _ => None,
    }
}
