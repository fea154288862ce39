//! What the answers have shown of each KV table: a key watched alone that goes missing below
//! its table's highest index was lost in a restore, not deleted.

use std::collections::HashMap;

use consul_kv::KvQuery;

use crate::Lock;

/// One KV table: a datacenter's, in a namespace and partition (Consul Enterprise).
pub(super) type Scope = (Option<String>, Option<String>, Option<String>);

pub(super) fn scope(query: &KvQuery) -> Scope {
    let scope = query.scope();
    (scope.datacenter.clone(), scope.namespace.clone(), scope.partition.clone())
}

/// What the answers have shown of one KV table. A missing key answers the table's index,
/// which only a restore or a rebuilt cluster takes below an index it answered before, so a key
/// watched alone that goes missing below it was lost, even where its own index did not go back
/// (a rebuilt cluster written past it before the watch read again).
#[derive(Default)]
struct Table {
    /// The highest index an answer showed since the table last went back.
    high: u64,
    /// How often it went back: answers to requests sent before then raise `high` no more.
    epoch: u64,
}

/// The tables of every scope the runner reads.
#[derive(Default)]
pub(super) struct Tables(std::sync::Mutex<HashMap<Scope, Table>>);

impl Tables {
    /// The highest index the table of `scope` answered, and its epoch.
    pub(super) fn get(&self, scope: &Scope) -> (u64, u64) {
        self.0.locked().get(scope).map_or((0, 0), |t| (t.high, t.epoch))
    }

    /// An answer to a request sent in `epoch` showed `index` of the table of `scope`.
    pub(super) fn saw(&self, scope: &Scope, epoch: u64, index: u64) {
        let mut tables = self.0.locked();
        let table = tables.entry(scope.clone()).or_default();
        if table.epoch == epoch {
            table.high = table.high.max(index);
        }
    }

    /// The table of `scope` went back to `index`.
    pub(super) fn went_back(&self, scope: &Scope, index: u64) {
        let mut tables = self.0.locked();
        let table = tables.entry(scope.clone()).or_default();
        *table = Table { high: index, epoch: table.epoch + 1 };
    }
}
