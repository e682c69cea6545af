//! Rendezvous (highest random weight) hashing: the owner of a shard is the
//! member with the highest score for it. Every daemon that sees the same
//! members computes the same owner; a member leaving moves only the
//! shards it owned, a member joining takes only the shards it now wins.
//!
//! The score is FNV-1a (64-bit) over the member id, the table and the
//! shard, each followed by a zero byte, finished by splitmix64's mixer.
//! It is fixed here, not taken from the standard library's hasher (whose
//! output may change between Rust releases): daemons built by different
//! compilers must agree.

/// The score of `member` for shard `shard` of `table`.
pub fn score(member: &str, table: &str, shard: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    for part in [member, table, shard] {
        for &b in part.as_bytes().iter().chain(&[0u8]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(PRIME);
        }
    }
    // splitmix64's finaliser: FNV's low bits alone spread poorly.
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The member of `members` that owns shard `shard` of `table`: the highest
/// score, ties (never seen in practice) to the smaller id. `None` without
/// members.
pub fn owner<'a>(
    members: impl IntoIterator<Item = &'a str>,
    table: &str,
    shard: &str,
) -> Option<&'a str> {
    members
        .into_iter()
        .map(|m| (score(m, table, shard), std::cmp::Reverse(m), m))
        .max()
        .map(|(_, _, m)| m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shards(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("shard-{i}")).collect()
    }

    #[test]
    fn the_score_is_fixed_across_builds() {
        // Pinned (computed independently, in Python): a change here reassigns every shard of a running cluster
        // whose daemons run different builds.
        assert_eq!(score("a", "t", "s"), score("a", "t", "s"));
        assert_eq!(score("m1", "orders", "0"), 0x0b00_37de_abca_8e0e);
        assert_ne!(score("m1", "orders", "0"), score("m1", "orders", "1"));
        // The separators keep ("ab", "c") and ("a", "bc") apart.
        assert_ne!(score("ab", "c", "s"), score("a", "bc", "s"));
    }

    #[test]
    fn every_member_wins_a_fair_share() {
        let members = ["m1", "m2", "m3"];
        let mut counts = [0usize; 3];
        for s in shards(3000) {
            let o = owner(members, "t", &s).expect("an owner");
            counts[members.iter().position(|m| *m == o).expect("a member")] += 1;
        }
        for c in counts {
            assert!((800..1200).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn a_member_leaving_moves_only_its_shards() {
        let all = ["m1", "m2", "m3", "m4"];
        let left = ["m1", "m2", "m4"];
        for s in shards(1000) {
            let before = owner(all, "t", &s).expect("an owner");
            let after = owner(left, "t", &s).expect("an owner");
            if before != "m3" {
                assert_eq!(before, after, "{s} moved off a member that stayed");
            }
        }
    }

    #[test]
    fn a_member_joining_takes_only_what_it_wins() {
        let before_members = ["m1", "m2"];
        let after_members = ["m1", "m2", "m3"];
        let mut taken = 0;
        for s in shards(1000) {
            let before = owner(before_members, "t", &s).expect("an owner");
            let after = owner(after_members, "t", &s).expect("an owner");
            if after != before {
                assert_eq!(after, "m3", "{s} moved between members that stayed");
                taken += 1;
            }
        }
        assert!((250..420).contains(&taken), "{taken}");
    }

    #[test]
    fn no_members_no_owner() {
        assert_eq!(owner(std::iter::empty(), "t", "s"), None);
    }
}
