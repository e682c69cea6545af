//! memwal's cluster layer: which daemons are alive and which of them
//! should own which shard, decided through etcd.
//!
//! - Membership ([`Cluster::join`]): each daemon holds an etcd lease and a
//!   member key under it (`{prefix}/members/{id}` = its advertised
//!   address). A daemon whose lease expires (dead, paused, cut off from
//!   etcd) leaves the member list; it joins again with a new lease when it
//!   can.
//! - The desired owner of a shard ([`View::desired`]): rendezvous hashing
//!   of (table, shard) over the live members ([`rendezvous`]), so every
//!   daemon with the same member list computes the same owner, and a
//!   member joining or leaving moves only the shards it wins or held.
//! - The recorded owner ([`Cluster::acquire`], [`Cluster::release`]): a
//!   daemon records itself as a shard's owner (`{prefix}/owners/{table}/
//!   {shard}`, under its lease, created only if absent) before it claims
//!   the shard, and deletes the record after it closed the shard on a
//!   handover. A dead member's records go with its lease: survivors see
//!   the shard unowned and the desired survivor claims it.
//!
//! etcd only decides who should own what. It never makes a write safe:
//! the shard's claim bumps `writer_epoch` in the object store, and a
//! writer fenced by a newer claim never acknowledges a put, whatever etcd
//! said (a paused daemon whose lease expired, a split between etcd and
//! the object store). See `docs/design/cluster.md`.

mod error;
mod member;
pub mod rendezvous;
mod view;

pub use error::ClusterError;
pub use member::{read_cluster, Acquired, Cluster, ClusterConfig};
pub use view::{Member, Owner, View};
