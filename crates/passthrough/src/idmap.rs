//! ID translation between the client and the host (virtiofsd's
//! `--translate-uid` and `--translate-gid`): the client's user and group
//! IDs (a guest's) are not the host's, and each crossing translates them.
//!
//! An [`IdMap`] translates one kind of ID in two independent directions,
//! each a set of disjoint ranges built from [`IdMapping`]s: client to host
//! (`guest`, `squash-guest`, `forbid-guest`, the client side of `map`:
//! credentials, SETATTR owners, IDs in ACLs set; a forbidden ID is
//! [`Forbidden`], EPERM) and host to client (`host`, `squash-host`, the
//! host side of `map`: owners in attributes, IDs in ACLs read). An ID no
//! range covers is the same number on the other side; the directions need
//! not agree. No range, source or target, reaches 4294967295
//! (`(uid_t)-1`, which names no ID and to chown means "unchanged");
//! virtiofsd checks only the source.

use fuse_core::Errno;
use std::fmt;
use std::num::ParseIntError;
use std::str::FromStr;

/// One `--translate-uid` / `--translate-gid` value, as virtiofsd writes
/// it: `<type>:<source base>:<target base>:<count>`, or
/// `forbid-guest:<guest base>:<count>`.
///
/// The type is read in any case; the separator is whatever character
/// follows it (not a letter, digit, `-` or `_`), `:` in practice, and the
/// same one separates every number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdMapping {
    /// `guest:<guest base>:<host base>:<count>`: guest IDs to host IDs,
    /// one to one.
    Guest {
        /// First guest ID.
        guest: u32,
        /// Host ID of the first guest ID.
        host: u32,
        /// IDs in the range.
        count: u32,
    },
    /// `host:<host base>:<guest base>:<count>`: host IDs to guest IDs,
    /// one to one.
    Host {
        /// First host ID.
        host: u32,
        /// Guest ID of the first host ID.
        guest: u32,
        /// IDs in the range.
        count: u32,
    },
    /// `squash-guest:<guest base>:<host ID>:<count>`: every guest ID of
    /// the range to one host ID.
    SquashGuest {
        /// First guest ID.
        guest: u32,
        /// The host ID.
        host: u32,
        /// IDs in the range.
        count: u32,
    },
    /// `squash-host:<host base>:<guest ID>:<count>`: every host ID of the
    /// range to one guest ID.
    SquashHost {
        /// First host ID.
        host: u32,
        /// The guest ID.
        guest: u32,
        /// IDs in the range.
        count: u32,
    },
    /// `forbid-guest:<guest base>:<count>`: guest IDs that have no host ID
    /// (requests with them, and giving a file one, fail with EPERM).
    ForbidGuest {
        /// First guest ID.
        guest: u32,
        /// IDs in the range.
        count: u32,
    },
    /// `map:<guest base>:<host base>:<count>`: one to one in both
    /// directions.
    Map {
        /// First guest ID.
        guest: u32,
        /// First host ID.
        host: u32,
        /// IDs in the range.
        count: u32,
    },
}

/// A mapping that cannot be taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdMapError {
    /// Nothing after the type (or nothing at all).
    #[error(
        "{0:?}: expected <type>:<source base>:<target base>:<count> \
         or forbid-guest:<guest base>:<count>"
    )]
    NoNumbers(String),
    /// A type virtiofsd does not know.
    #[error("unknown type {0:?} (guest, host, map, squash-guest, squash-host or forbid-guest)")]
    UnknownType(String),
    /// Too many or too few numbers for the type.
    #[error("{kind} takes {expected} numbers after the type, {given} given")]
    Numbers {
        /// The type.
        kind: &'static str,
        /// How many it takes.
        expected: usize,
        /// How many there were.
        given: usize,
    },
    /// A number that is no u32.
    #[error("{value:?} is not an ID or count (0 to 4294967295)")]
    NotANumber {
        /// What was given.
        value: String,
        /// Why it is not one.
        #[source]
        source: ParseIntError,
    },
    /// A range that would reach 4294967295 or wrap around.
    #[error("{mapping}: the {side} range goes past 4294967294, the highest ID")]
    TooHigh {
        /// The mapping.
        mapping: IdMapping,
        /// `guest` or `host`.
        side: &'static str,
    },
    /// Two ranges of one direction overlap.
    #[error("{mapping} overlaps {earlier} ({direction})")]
    Overlap {
        /// The later mapping.
        mapping: IdMapping,
        /// The one given before it.
        earlier: IdMapping,
        /// `guest to host` or `host to guest`.
        direction: &'static str,
    },
}

impl IdMapping {
    /// The type's name, as written.
    pub fn kind(&self) -> &'static str {
        match self {
            IdMapping::Guest { .. } => "guest",
            IdMapping::Host { .. } => "host",
            IdMapping::SquashGuest { .. } => "squash-guest",
            IdMapping::SquashHost { .. } => "squash-host",
            IdMapping::ForbidGuest { .. } => "forbid-guest",
            IdMapping::Map { .. } => "map",
        }
    }
}

impl fmt::Display for IdMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = self.kind();
        match *self {
            IdMapping::Guest { guest, host, count }
            | IdMapping::SquashGuest { guest, host, count }
            | IdMapping::Map { guest, host, count } => write!(f, "{k}:{guest}:{host}:{count}"),
            IdMapping::Host { host, guest, count }
            | IdMapping::SquashHost { host, guest, count } => {
                write!(f, "{k}:{host}:{guest}:{count}")
            }
            IdMapping::ForbidGuest { guest, count } => write!(f, "{k}:{guest}:{count}"),
        }
    }
}

impl FromStr for IdMapping {
    type Err = IdMapError;

    fn from_str(s: &str) -> Result<IdMapping, IdMapError> {
        let type_end = s
            .find(|c: char| !(c.is_alphanumeric() || c == '-' || c == '_'))
            .ok_or_else(|| IdMapError::NoNumbers(s.into()))?;
        let mut rest = s[type_end..].chars();
        let sep = rest.next().ok_or_else(|| IdMapError::NoNumbers(s.into()))?;
        let (kind, expected) = match s[..type_end].to_lowercase().as_str() {
            "guest" => ("guest", 3),
            "host" => ("host", 3),
            "squash-guest" => ("squash-guest", 3),
            "squash-host" => ("squash-host", 3),
            "map" => ("map", 3),
            "forbid-guest" => ("forbid-guest", 2),
            other => return Err(IdMapError::UnknownType(other.into())),
        };
        let n = rest
            .as_str()
            .split(sep)
            .map(|v| {
                v.parse::<u32>().map_err(|source| IdMapError::NotANumber {
                    value: v.into(),
                    source,
                })
            })
            .collect::<Result<Vec<u32>, IdMapError>>()?;
        Ok(match (kind, &n[..]) {
            ("guest", &[guest, host, count]) => IdMapping::Guest { guest, host, count },
            ("host", &[host, guest, count]) => IdMapping::Host { host, guest, count },
            ("squash-guest", &[guest, host, count]) => {
                IdMapping::SquashGuest { guest, host, count }
            }
            ("squash-host", &[host, guest, count]) => IdMapping::SquashHost { host, guest, count },
            ("map", &[guest, host, count]) => IdMapping::Map { guest, host, count },
            ("forbid-guest", &[guest, count]) => IdMapping::ForbidGuest { guest, count },
            _ => {
                return Err(IdMapError::Numbers {
                    kind,
                    expected,
                    given: n.len(),
                })
            }
        })
    }
}

/// What a range translates its IDs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// One to one: the range's first ID becomes this one.
    Base(u32),
    /// All to this one.
    Squash(u32),
    /// None (forbid-guest).
    Forbid,
}

/// IDs `start..end` of one direction, and what they become.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rule {
    start: u32,
    /// Exclusive, at most `u32::MAX`.
    end: u32,
    to: Target,
    /// The mapping it came from (for overlap errors).
    from: IdMapping,
}

/// Disjoint rules of one direction, sorted by start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Rules(Vec<Rule>);

impl Rules {
    fn find(&self, id: u32) -> Option<&Rule> {
        // The last rule starting at or before `id`: only it can hold it.
        let i = self.0.partition_point(|r| r.start <= id);
        self.0[..i].last().filter(|r| id < r.end)
    }

    fn add(&mut self, r: Rule, direction: &'static str) -> Result<(), IdMapError> {
        if r.start == r.end {
            // An empty range: nothing to translate (as in virtiofsd).
            return Ok(());
        }
        let i = self.0.partition_point(|o| o.start < r.start);
        let clash = [i.checked_sub(1), Some(i)]
            .into_iter()
            .flatten()
            .filter_map(|j| self.0.get(j))
            .find(|o| o.start < r.end && r.start < o.end);
        if let Some(o) = clash {
            return Err(IdMapError::Overlap {
                mapping: r.from,
                earlier: o.from,
                direction,
            });
        }
        self.0.insert(i, r);
        Ok(())
    }
}

/// A guest ID configured with `forbid-guest`: it has no host ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("guest ID {0} is forbidden (forbid-guest)")]
pub struct Forbidden(pub u32);

impl From<Forbidden> for Errno {
    fn from(_: Forbidden) -> Errno {
        Errno::EPERM
    }
}

/// The translation of one kind of ID (see the module docs). The default
/// translates nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdMap {
    to_host: Rules,
    to_guest: Rules,
}

const TO_HOST: &str = "guest to host";
const TO_GUEST: &str = "host to guest";

/// `base..base + count` (exclusive, so never holding 4294967295), or an
/// error naming `side` if that wraps around.
fn span(m: IdMapping, side: &'static str, base: u32, count: u32) -> Result<(u32, u32), IdMapError> {
    base.checked_add(count)
        .map(|end| (base, end))
        .ok_or(IdMapError::TooHigh { mapping: m, side })
}

impl IdMap {
    /// The translation `mappings` describe, in order (as virtiofsd takes
    /// repeated options); an error if one reaches 4294967295 or overlaps
    /// an earlier one in a direction they share.
    pub fn new(mappings: &[IdMapping]) -> Result<IdMap, IdMapError> {
        let mut map = IdMap::default();
        for &m in mappings {
            map.add(m)?;
        }
        Ok(map)
    }

    fn add(&mut self, m: IdMapping) -> Result<(), IdMapError> {
        let rule = |(start, end): (u32, u32), to| Rule {
            start,
            end,
            to,
            from: m,
        };
        // A squash target is one ID: it must be a real one.
        let one = |side, id: u32| {
            if id == u32::MAX {
                Err(IdMapError::TooHigh { mapping: m, side })
            } else {
                Ok(id)
            }
        };
        match m {
            IdMapping::Guest { guest, host, count } => {
                span(m, "host", host, count)?;
                let r = rule(span(m, "guest", guest, count)?, Target::Base(host));
                self.to_host.add(r, TO_HOST)
            }
            IdMapping::Host { host, guest, count } => {
                span(m, "guest", guest, count)?;
                let r = rule(span(m, "host", host, count)?, Target::Base(guest));
                self.to_guest.add(r, TO_GUEST)
            }
            IdMapping::SquashGuest { guest, host, count } => {
                let to = Target::Squash(one("host", host)?);
                self.to_host
                    .add(rule(span(m, "guest", guest, count)?, to), TO_HOST)
            }
            IdMapping::SquashHost { host, guest, count } => {
                let to = Target::Squash(one("guest", guest)?);
                self.to_guest
                    .add(rule(span(m, "host", host, count)?, to), TO_GUEST)
            }
            IdMapping::ForbidGuest { guest, count } => {
                let r = rule(span(m, "guest", guest, count)?, Target::Forbid);
                self.to_host.add(r, TO_HOST)
            }
            IdMapping::Map { guest, host, count } => {
                let g = span(m, "guest", guest, count)?;
                let h = span(m, "host", host, count)?;
                self.to_host.add(rule(g, Target::Base(host)), TO_HOST)?;
                self.to_guest.add(rule(h, Target::Base(guest)), TO_GUEST)
            }
        }
    }

    /// Whether every ID is itself in both directions (nothing configured,
    /// or only empty ranges).
    pub fn is_identity(&self) -> bool {
        self.to_host.0.is_empty() && self.to_guest.0.is_empty()
    }

    /// The host ID of guest ID `id`.
    pub fn to_host(&self, id: u32) -> Result<u32, Forbidden> {
        match self.to_host.find(id) {
            None => Ok(id),
            Some(r) => match r.to {
                Target::Base(b) => Ok(b + (id - r.start)),
                Target::Squash(to) => Ok(to),
                Target::Forbid => Err(Forbidden(id)),
            },
        }
    }

    /// The guest ID of host ID `id`.
    pub fn to_guest(&self, id: u32) -> u32 {
        match self.to_guest.find(id).map(|r| (r.to, r.start)) {
            None | Some((Target::Forbid, _)) => id,
            Some((Target::Base(b), start)) => b + (id - start),
            Some((Target::Squash(to), _)) => to,
        }
    }
}

/// ACL entry tags that carry an ID (`ACL_USER`, `ACL_GROUP`).
const ACL_USER: u16 = 0x02;
const ACL_GROUP: u16 = 0x08;
/// `POSIX_ACL_XATTR_VERSION`.
const ACL_VERSION: u32 = 2;

/// Rewrites the IDs of the `ACL_USER` and `ACL_GROUP` entries of a POSIX
/// ACL in its xattr form (`system.posix_acl_access` / `_default`: a
/// little-endian u32 version 2, then `{u16 tag, u16 perm, u32 id}`
/// entries) with `uid` and `gid`. A value that is not that (wrong version,
/// a partial entry) is left as it is: the host kernel refuses it, and it
/// has no IDs to translate.
fn acl_ids<E>(
    value: &mut [u8],
    mut uid: impl FnMut(u32) -> Result<u32, E>,
    mut gid: impl FnMut(u32) -> Result<u32, E>,
) -> Result<(), E> {
    let Some((head, entries)) = value.split_first_chunk_mut::<4>() else {
        return Ok(());
    };
    if u32::from_le_bytes(*head) != ACL_VERSION || entries.len() % 8 != 0 {
        return Ok(());
    }
    for e in entries.chunks_exact_mut(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
        let new = match tag {
            ACL_USER => uid(id)?,
            ACL_GROUP => gid(id)?,
            _ => continue,
        };
        e[4..8].copy_from_slice(&new.to_le_bytes());
    }
    Ok(())
}

/// A client's ACL (xattr form) with its IDs made the host's; a forbidden
/// one is an error.
pub(super) fn acl_to_host(value: &mut [u8], uids: &IdMap, gids: &IdMap) -> Result<(), Forbidden> {
    acl_ids(value, |u| uids.to_host(u), |g| gids.to_host(g))
}

/// A host ACL (xattr form) with its IDs made the client's.
pub(super) fn acl_to_guest(value: &mut [u8], uids: &IdMap, gids: &IdMap) {
    let never = acl_ids::<std::convert::Infallible>(
        value,
        |u| Ok(uids.to_guest(u)),
        |g| Ok(gids.to_guest(g)),
    );
    let Ok(()) = never;
}

#[cfg(test)]
mod tests;
