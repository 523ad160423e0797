//! virtiofsd's `--xattrmap`: rules that rename, hide or refuse extended
//! attribute names between the client and the host, so a guest's
//! `security.*` or `trusted.*` names can live under a `user.` prefix on
//! the host (where an unprivileged daemon may write them, and where they
//! do not mean anything to the host's own LSM). The syntax is on
//! [`XattrMap`]. The first matching rule decides, and every name has an
//! answer: unlike virtiofsd, which aborts on a name no rule matches, a rule
//! set must end both scopes with a catch-all, checked when it is parsed.

use fuse_core::Errno;
use std::borrow::Cow;
use std::str::FromStr;

/// A rule set that does not parse (the rule is counted from 1).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum XattrMapError {
    /// No rules at all.
    #[error("no rules")]
    Empty,
    /// A rule that ends before its last delimiter.
    #[error("rule {0}: incomplete (every field ends with the rule's delimiter)")]
    Incomplete(usize),
    /// An unknown type.
    #[error("rule {0}: unknown type {1:?} (prefix, ok, bad, unsupported, map)")]
    Type(usize, String),
    /// An unknown scope.
    #[error("rule {0}: unknown scope {1:?} (client, server, all)")]
    Scope(usize, String),
    /// A delimiter that is alphanumeric.
    #[error("rule {0}: the delimiter {1:?} may not be a letter or digit")]
    Delimiter(usize, char),
    /// A `map` rule that is not the last.
    #[error("rule {0}: a map rule must be the only one and the last")]
    MapNotLast(usize),
    /// A NUL in a key or prefix.
    #[error("rule {0}: a NUL in a name")]
    Nul(usize),
    /// Names some scope has no answer for.
    #[error(
        "the rules do not end with a catch-all for {0} names (a rule with an empty {1}, such as :ok:all::: or :bad:all:::)"
    )]
    Unterminated(&'static str, &'static str),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Prefix,
    Ok,
    Bad,
    Unsupported,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    kind: Kind,
    client: bool,
    server: bool,
    key: Vec<u8>,
    prepend: Vec<u8>,
}

/// A parsed rule set. A rule set is a string of rules, each opened,
/// separated and closed by its own delimiter (the first character that is
/// not white space; white space may come between rules):
/// `:type:scope:key:prepend:`.
/// - scope `client` matches names the client sends (GETXATTR, SETXATTR,
///   REMOVEXATTR) by `key` as a prefix; `server` matches names the host
///   lists (LISTXATTR) by `prepend` as a prefix; `all` both.
/// - type `prefix`: a client name gets `prepend` in front on the host; a
///   host name loses its `prepend` for the client. `ok`: passes the name
///   unchanged. `bad`: the client gets EPERM, the host name is hidden.
///   `unsupported`: the client gets EOPNOTSUPP, the host name is hidden.
/// - `:map:key:prepend:` (at most one, the last rule) is short for
///   `prefix` of `key` to `prepend` both ways, then (with a `key`) `bad`
///   for names already carrying `prepend` (the client may not reach them
///   directly; unprefixed `key` names on the host are hidden) and `ok`
///   for the rest, or (without) `bad` for the rest.
///
/// Both scopes must end with a catch-all: a client rule with an empty key
/// and a server rule with an empty prepend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XattrMap {
    rules: Vec<Rule>,
}

/// What a client's name becomes on the host.
#[derive(Debug, PartialEq, Eq)]
pub enum Mapped<'a> {
    /// Use this host name.
    Name(Cow<'a, [u8]>),
    /// Refuse the call with this errno.
    Refused(Errno),
}

impl FromStr for XattrMap {
    type Err = XattrMapError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut rules = Vec::new();
        let mut rest = s.trim_start();
        let mut n = 0;
        let mut saw_map = false;
        while !rest.is_empty() {
            n += 1;
            if saw_map {
                return Err(XattrMapError::MapNotLast(n - 1));
            }
            let d = rest.chars().next().ok_or(XattrMapError::Empty)?;
            if d.is_alphanumeric() {
                return Err(XattrMapError::Delimiter(n, d));
            }
            let mut fields = Vec::new();
            let mut body = &rest[d.len_utf8()..];
            let kind = loop {
                let end = body.find(d).ok_or(XattrMapError::Incomplete(n))?;
                fields.push(&body[..end]);
                body = &body[end + d.len_utf8()..];
                let want = match fields[0] {
                    "map" => 3,
                    _ => 4,
                };
                if fields.len() == want {
                    break fields[0];
                }
            };
            rest = body.trim_start();
            let bytes = |f: &str| {
                if f.contains('\0') {
                    Err(XattrMapError::Nul(n))
                } else {
                    Ok(f.as_bytes().to_vec())
                }
            };
            if kind == "map" {
                saw_map = true;
                let (key, prepend) = (bytes(fields[1])?, bytes(fields[2])?);
                rules.extend(expand_map(key, prepend));
                continue;
            }
            let kind = match kind {
                "prefix" => Kind::Prefix,
                "ok" => Kind::Ok,
                "bad" => Kind::Bad,
                "unsupported" => Kind::Unsupported,
                other => return Err(XattrMapError::Type(n, other.into())),
            };
            let (client, server) = match fields[1] {
                "client" => (true, false),
                "server" => (false, true),
                "all" => (true, true),
                other => return Err(XattrMapError::Scope(n, other.into())),
            };
            rules.push(Rule {
                kind,
                client,
                server,
                key: bytes(fields[2])?,
                prepend: bytes(fields[3])?,
            });
        }
        if rules.is_empty() {
            return Err(XattrMapError::Empty);
        }
        if !rules.iter().any(|r| r.client && r.key.is_empty()) {
            return Err(XattrMapError::Unterminated("client", "key"));
        }
        if !rules.iter().any(|r| r.server && r.prepend.is_empty()) {
            return Err(XattrMapError::Unterminated("host", "prepend"));
        }
        Ok(XattrMap { rules })
    }
}

/// The rules `:map:key:prepend:` stands for.
fn expand_map(key: Vec<u8>, prepend: Vec<u8>) -> Vec<Rule> {
    let all = |kind, key: &[u8], prepend: &[u8]| Rule {
        kind,
        client: true,
        server: true,
        key: key.to_vec(),
        prepend: prepend.to_vec(),
    };
    let mut v = vec![all(Kind::Prefix, &key, &prepend)];
    if key.is_empty() {
        v.push(all(Kind::Bad, b"", b""));
    } else {
        // The client may not name the prefixed form itself; the host's
        // unprefixed names of the mapped kind are hidden.
        v.push(all(Kind::Bad, &prepend, &key));
        v.push(all(Kind::Ok, b"", b""));
    }
    v
}

impl XattrMap {
    /// The host name for the client's `name`, or the errno that refuses
    /// it.
    pub fn to_host<'a>(&self, name: &'a [u8]) -> Mapped<'a> {
        let Some(r) = self
            .rules
            .iter()
            .find(|r| r.client && name.starts_with(&r.key))
        else {
            // Not reached: parsing demands a client catch-all.
            return Mapped::Refused(Errno::EPERM);
        };
        match r.kind {
            Kind::Ok => Mapped::Name(Cow::Borrowed(name)),
            Kind::Bad => Mapped::Refused(Errno::EPERM),
            Kind::Unsupported => Mapped::Refused(Errno(libc::EOPNOTSUPP)),
            Kind::Prefix => Mapped::Name(Cow::Owned([&r.prepend[..], name].concat())),
        }
    }

    /// The client's name for the host's `name`, or None if hidden.
    pub fn to_guest<'a>(&self, name: &'a [u8]) -> Option<&'a [u8]> {
        let r = self
            .rules
            .iter()
            .find(|r| r.server && name.starts_with(&r.prepend))?;
        match r.kind {
            Kind::Ok => Some(name),
            Kind::Bad | Kind::Unsupported => None,
            Kind::Prefix => {
                let n = &name[r.prepend.len()..];
                // A host name that is only the prefix names nothing.
                (!n.is_empty()).then_some(n)
            }
        }
    }

    /// A LISTXATTR answer (NUL-terminated names) as the client sees it.
    pub fn list_to_guest(&self, names: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(names.len());
        for n in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
            if let Some(g) = self.to_guest(n) {
                out.extend_from_slice(g);
                out.push(0);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(m: &XattrMap, n: &str) -> Result<String, Errno> {
        match m.to_host(n.as_bytes()) {
            Mapped::Name(h) => Ok(String::from_utf8(h.into_owned()).unwrap()),
            Mapped::Refused(e) => Err(e),
        }
    }

    fn guest(m: &XattrMap, n: &str) -> Option<String> {
        m.to_guest(n.as_bytes())
            .map(|g| String::from_utf8(g.to_vec()).unwrap())
    }

    #[test]
    fn map_everything_under_a_prefix() {
        let m: XattrMap = ":map::user.virtiofs.:".parse().unwrap();
        assert_eq!(
            m,
            ":prefix:all::user.virtiofs.::bad:all:::".parse().unwrap()
        );
        assert_eq!(
            host(&m, "security.selinux").unwrap(),
            "user.virtiofs.security.selinux"
        );
        assert_eq!(host(&m, "user.x").unwrap(), "user.virtiofs.user.x");
        assert_eq!(
            guest(&m, "user.virtiofs.security.selinux").as_deref(),
            Some("security.selinux")
        );
        assert_eq!(guest(&m, "security.selinux"), None, "the host's own");
        assert_eq!(guest(&m, "user.virtiofs."), None);
        let list =
            m.list_to_guest(b"user.virtiofs.trusted.a\0security.selinux\0user.virtiofs.user.b\0");
        assert_eq!(list, b"trusted.a\0user.b\0");
    }

    #[test]
    fn map_one_namespace_and_pass_the_rest() {
        let m: XattrMap = "/map/trusted./user.virtiofs./".parse().unwrap();
        let long: XattrMap = "/prefix/all/trusted./user.virtiofs./
            /bad/all/user.virtiofs./trusted./
            /ok/all///"
            .parse()
            .unwrap();
        assert_eq!(m, long);
        assert_eq!(host(&m, "trusted.x").unwrap(), "user.virtiofs.trusted.x");
        assert_eq!(host(&m, "user.plain").unwrap(), "user.plain");
        assert_eq!(host(&m, "user.virtiofs.trusted.x"), Err(Errno::EPERM));
        assert_eq!(
            guest(&m, "user.virtiofs.trusted.x").as_deref(),
            Some("trusted.x")
        );
        assert_eq!(guest(&m, "trusted.host"), None);
        assert_eq!(guest(&m, "user.plain").as_deref(), Some("user.plain"));
    }

    #[test]
    fn explicit_rules_and_their_errnos() {
        let m: XattrMap = "  :ok:client:user.:: :unsupported:client:system.:: \
             :bad:all:security.:security.:  :ok:all:::  "
            .parse()
            .unwrap();
        assert_eq!(host(&m, "user.a").unwrap(), "user.a");
        assert_eq!(host(&m, "system.x"), Err(Errno(libc::EOPNOTSUPP)));
        assert_eq!(host(&m, "security.x"), Err(Errno::EPERM));
        assert_eq!(host(&m, "trusted.x").unwrap(), "trusted.x");
        assert_eq!(guest(&m, "security.x"), None);
        assert_eq!(guest(&m, "system.x").as_deref(), Some("system.x"));
    }

    #[test]
    fn malformed_rule_sets_are_errors() {
        use XattrMapError as E;
        let e = |s: &str| s.parse::<XattrMap>().unwrap_err();
        assert_eq!(e(""), E::Empty);
        assert_eq!(e("   "), E::Empty);
        assert_eq!(e(":prefix:all:trusted.:user.vm."), E::Incomplete(1));
        assert_eq!(e(":ok:all:::x"), E::Delimiter(2, 'x'));
        assert_eq!(e(":nope:all:::"), E::Type(1, "nope".into()));
        assert_eq!(e(":ok:both:::"), E::Scope(1, "both".into()));
        assert_eq!(e(":map::a.::ok:all:::"), E::MapNotLast(1));
        assert_eq!(e(":ok:client:::"), E::Unterminated("host", "prepend"));
        assert_eq!(e(":ok:server:::"), E::Unterminated("client", "key"));
        assert_eq!(e(":ok:all:user.:user.:"), E::Unterminated("client", "key"));
    }
}
