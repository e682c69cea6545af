//! What the cluster looks like from etcd: the live members and the
//! recorded shard owners, as of one etcd revision.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A live daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Its id (unique per process start).
    #[serde(skip)]
    pub id: String,
    /// Where its Flight service answers (`grpc://HOST:PORT`).
    pub advertise: String,
}

/// A recorded shard owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// The owning member's id.
    pub member: String,
    /// The shard's field values (field id to lower-case hex), so that a
    /// survivor can claim a dead member's shard from the record alone.
    pub values: BTreeMap<String, String>,
}

/// The members and owners under the cluster's prefix at one revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    /// The etcd revision this view reflects.
    pub revision: i64,
    members: BTreeMap<String, Member>,
    owners: BTreeMap<(String, String), Owner>,
}

/// What a key under the prefix is.
enum Entry<'a> {
    Member(&'a str),
    Owner(&'a str, &'a str),
}

fn parse<'a>(prefix: &str, key: &'a str) -> Option<Entry<'a>> {
    let rest = key.strip_prefix(prefix)?.strip_prefix('/')?;
    if let Some(id) = rest.strip_prefix("members/") {
        return Some(Entry::Member(id));
    }
    let (table, shard) = rest.strip_prefix("owners/")?.split_once('/')?;
    Some(Entry::Owner(table, shard))
}

/// The rendezvous name of a table's compactor: not a shard id (those are
/// UUIDs: hex digits and dashes), so it never shares a shard's score.
const COMPACTOR_SLOT: &str = "#compactor";

impl View {
    /// The live members, by id.
    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    /// The member `id`, when live.
    pub fn member(&self, id: &str) -> Option<&Member> {
        self.members.get(id)
    }

    /// The recorded owner of `shard` of `table`.
    pub fn owner(&self, table: &str, shard: &str) -> Option<&Owner> {
        self.owners.get(&(table.to_string(), shard.to_string()))
    }

    /// Every recorded owner of `table`'s shards, by shard.
    pub fn owners_of<'a>(&'a self, table: &'a str) -> impl Iterator<Item = (&'a str, &'a Owner)> {
        self.owners
            .iter()
            .filter(move |((t, _), _)| t == table)
            .map(|((_, s), o)| (s.as_str(), o))
    }

    /// Every recorded owner, as ((table, shard), owner).
    pub fn owners(&self) -> impl Iterator<Item = (&(String, String), &Owner)> {
        self.owners.iter()
    }

    /// The member that should own `shard` of `table` now (rendezvous
    /// hashing over the live members); `None` without members.
    pub fn desired(&self, table: &str, shard: &str) -> Option<&Member> {
        let id = crate::rendezvous::owner(self.members.keys().map(String::as_str), table, shard)?;
        self.members.get(id)
    }

    /// The member that runs `table`'s compactor and GC now (rendezvous
    /// hashing over the live members, on a name no shard id takes);
    /// `None` without members. Members agree on it as on shard owners,
    /// and it moves only when that member leaves or a joining one wins
    /// it.
    pub fn compactor(&self, table: &str) -> Option<&Member> {
        let id = crate::rendezvous::owner(
            self.members.keys().map(String::as_str),
            table,
            COMPACTOR_SLOT,
        )?;
        self.members.get(id)
    }

    /// Applies a put (`Some(value)`) or delete of `key`. Keys outside the
    /// layout and values that do not decode are ignored (logged): a
    /// foreign or damaged key must not stop the cluster.
    pub(crate) fn apply(&mut self, prefix: &str, key: &[u8], value: Option<&[u8]>) {
        let Ok(key) = std::str::from_utf8(key) else {
            return;
        };
        match (parse(prefix, key), value) {
            (Some(Entry::Member(id)), Some(v)) => match serde_json::from_slice::<Member>(v) {
                Ok(mut m) => {
                    m.id = id.to_string();
                    self.members.insert(id.to_string(), m);
                }
                Err(e) => tracing::warn!(key, error = %e, "member record does not decode; ignored"),
            },
            (Some(Entry::Member(id)), None) => {
                self.members.remove(id);
            }
            (Some(Entry::Owner(table, shard)), Some(v)) => {
                match serde_json::from_slice::<Owner>(v) {
                    Ok(o) => {
                        self.owners
                            .insert((table.to_string(), shard.to_string()), o);
                    }
                    Err(e) => {
                        tracing::warn!(key, error = %e, "owner record does not decode; ignored")
                    }
                }
            }
            (Some(Entry::Owner(table, shard)), None) => {
                self.owners.remove(&(table.to_string(), shard.to_string()));
            }
            (None, _) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn puts_and_deletes_build_the_view() {
        let mut v = View::default();
        v.apply(
            "/p",
            b"/p/members/a",
            Some(br#"{"advertise":"grpc://h:1"}"#),
        );
        v.apply(
            "/p",
            b"/p/members/b",
            Some(br#"{"advertise":"grpc://h:2"}"#),
        );
        v.apply(
            "/p",
            b"/p/owners/t/s1",
            Some(br#"{"member":"a","values":{"1":"00000000"}}"#),
        );
        v.apply("/p", b"/p/owners/t/s1x", Some(b"not json"));
        v.apply("/p", b"/other/members/c", Some(br#"{"advertise":"x"}"#));
        assert_eq!(
            v.members().map(|m| m.id.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(v.owner("t", "s1").map(|o| o.member.as_str()), Some("a"));
        assert!(v.owner("t", "s1x").is_none());
        assert!(v.desired("t", "s1").is_some());
        v.apply("/p", b"/p/members/a", None);
        v.apply("/p", b"/p/owners/t/s1", None);
        assert_eq!(v.members().count(), 1);
        assert_eq!(v.desired("t", "s1").map(|m| m.id.as_str()), Some("b"));
        assert_eq!(v.owners_of("t").count(), 0);
    }

    // Breaks if members with the same view disagree on a table's
    // compactor, if every table gets the same one (no spread), or if it
    // moves when a member other than it leaves.
    #[test]
    fn one_compactor_per_table_moves_only_with_its_member() {
        let view = |ids: &[&str]| {
            let mut v = View::default();
            for id in ids {
                let key = format!("/p/members/{id}");
                v.apply("/p", key.as_bytes(), Some(br#"{"advertise":"grpc://h:1"}"#));
            }
            v
        };
        let ids = ["m1", "m2", "m3", "m4"];
        let all = view(&ids);
        let reversed = view(&["m4", "m3", "m2", "m1"]);
        let tables: Vec<String> = (0..64).map(|i| format!("t{i}")).collect();
        let mut chosen = std::collections::BTreeSet::new();
        for t in &tables {
            let c = all.compactor(t).unwrap().id.clone();
            assert_eq!(reversed.compactor(t).unwrap().id, c, "{t}");
            chosen.insert(c.clone());
            for gone in ids.iter().filter(|id| **id != c) {
                let rest: Vec<&str> = ids.iter().copied().filter(|id| id != gone).collect();
                assert_eq!(
                    view(&rest).compactor(t).unwrap().id,
                    c,
                    "{t} without {gone}"
                );
            }
        }
        assert_eq!(chosen.len(), ids.len(), "tables spread over members");
        assert!(View::default().compactor("t").is_none());
    }
}
