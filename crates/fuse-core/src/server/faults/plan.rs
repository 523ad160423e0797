//! Parsing a [`FaultPlan`] (its syntax is on the type).

use super::{Fault, FaultPlan, PlanError, Rule};
use crate::abi::Opcode;
use crate::chan::Errno;
use std::time::Duration;

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
