//! A status kept in memory as deflated JSON, continuing a deflated dictionary of what every
//! status says: deflated alone, most of a status's bytes would be the field names, reasons and
//! messages it shares with every other binding's.

use std::sync::OnceLock;

use consulbind_api::ConsulBindingStatus;
use miniz_oxide::deflate::core::{
    CompressorOxide, TDEFLFlush, TDEFLStatus, compress_to_output, create_comp_flags_from_zip_params,
};

/// Statuses of the shapes most bindings have, the commonest last: a nearer match costs fewer
/// bits. Read into the status type and written again (see [`dictionary`]), so that its fields
/// come in the order the controller writes them.
const TYPICAL: [&str; 2] = [
    r#"{"objects":[{"kind":"ConfigMap","name":"","present":true,"entries":1,"checksum":"v3:","referenced":true},
        {"kind":"Secret","name":"","present":true,"entries":1,"checksum":"v3:","referenced":true}],
        "rollout":{"checksum":"v3:","wave":1,"waves":2,"phase":"Rolling","since":"2026-01-01T00:00:00Z",
        "startedTime":"2026-01-01T00:00:00Z","progress":"1/2 Rolling"},
        "targets":[{"kind":"StatefulSet","name":"","checksum":"v3:","uid":"","state":"Healthy"}]}"#,
    r#"{"observedGeneration":1,"appliedChecksum":"v3:","shortChecksum":"","keySummary":"1/1","targetSummary":"1/1",
        "keys":[{"key":"","present":true,"checksum":"v3:","modifyIndex":1}],
        "targets":[{"kind":"Deployment","name":"","checksum":"v3:","lastRolledTime":"2026-01-01T00:00:00.000000Z","uid":""}],
        "lastSyncTime":"2026-01-01T00:00:00Z","lastChangeTime":"2026-01-01T00:00:00Z","observedSpec":"",
        "conditions":[
        {"lastTransitionTime":"2026-01-01T00:00:00Z","message":"read 1 key from Consul","observedGeneration":1,"reason":"Synced","status":"True","type":"ConsulSynced"},
        {"lastTransitionTime":"2026-01-01T00:00:00Z","message":"1 target carries the applied content","observedGeneration":1,"reason":"UpToDate","status":"True","type":"TargetsUpdated"},
        {"lastTransitionTime":"2026-01-01T00:00:00Z","message":"1 target carries the current content","observedGeneration":1,"reason":"UpToDate","status":"True","type":"Ready"},
        {"lastTransitionTime":"2026-01-01T00:00:00Z","message":"no work is under way","observedGeneration":1,"reason":"UpToDate","status":"False","type":"Reconciling"},
        {"lastTransitionTime":"2026-01-01T00:00:00Z","message":"nothing waits for a person","observedGeneration":1,"reason":"UpToDate","status":"False","type":"Stalled"}]}"#,
];

/// [`TYPICAL`] as the controller writes it. Only this process reads what it packs, so the
/// dictionary may change from one release to the next.
fn dictionary() -> &'static [u8] {
    static DICTIONARY: OnceLock<Vec<u8>> = OnceLock::new();
    DICTIONARY.get_or_init(|| {
        let typical = TYPICAL.iter().filter_map(|json| serde_json::from_str::<ConsulBindingStatus>(json).ok());
        typical.flat_map(|status| serde_json::to_vec(&status).unwrap_or_default()).collect()
    })
}

/// JSON kept deflated; an empty one, empty.
#[derive(Debug)]
pub struct Packed(Box<[u8]>);

impl Packed {
    /// Fast over small: a status is deflated on every version the binding watch sends.
    const LEVEL: i32 = 6;
    /// Far above any object the API server stores (its limit is about 1.5 MiB).
    const LIMIT: usize = 8 << 20;

    pub fn new(json: &[u8]) -> Self {
        if json.is_empty() {
            return Self(Box::default());
        }
        let mut stream = deflate(&[dictionary(), json]);
        debug_assert!(stream.starts_with(prefix()), "the dictionary deflates alike every time");
        Self(stream.split_off(prefix().len()).into())
    }

    /// The JSON again; empty if none was kept.
    pub fn json(&self) -> Vec<u8> {
        if self.0.is_empty() {
            return Vec::new();
        }
        let stream = [prefix(), &self.0].concat();
        let limit = Self::LIMIT + dictionary().len();
        match miniz_oxide::inflate::decompress_to_vec_with_limit(&stream, limit) {
            Ok(mut json) if json.starts_with(dictionary()) => json.split_off(dictionary().len()),
            _ => Vec::new(),
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

/// The dictionary deflated and flushed to a byte boundary: every packed status continues it.
fn prefix() -> &'static [u8] {
    static PREFIX: OnceLock<Vec<u8>> = OnceLock::new();
    PREFIX.get_or_init(|| deflate(&[dictionary()]))
}

/// One raw deflate stream of `parts`, each flushed to a byte boundary and the last finished.
/// The stream ends open (a sync flush) when there is one part, so that another may follow.
fn deflate(parts: &[&[u8]]) -> Vec<u8> {
    let mut compressor = CompressorOxide::new(create_comp_flags_from_zip_params(Packed::LEVEL, 0, 0));
    let mut out = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let flush = match i + 1 == parts.len() && parts.len() > 1 {
            true => TDEFLFlush::Finish,
            false => TDEFLFlush::Sync,
        };
        let (status, _) = compress_to_output(&mut compressor, part, flush, |bytes| {
            out.extend_from_slice(bytes);
            true
        });
        debug_assert!(matches!(status, TDEFLStatus::Okay | TDEFLStatus::Done), "{status:?}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_packed_comes_back_whole() {
        for json in [&b""[..], b"{}", br#"{"appliedChecksum":"sha256:0123"}"#, &[b'x'; 100_000][..]] {
            assert_eq!(Packed::new(json).json(), json);
        }
    }

    /// A status with the shape the controller writes for one key and one target, packed
    /// against the dictionary and deflated alone.
    #[test]
    fn the_dictionary_packs_a_status_smaller_than_it_deflates_alone() {
        let status: ConsulBindingStatus = serde_json::from_str(SAMPLE).unwrap();
        let json = serde_json::to_vec(&status).unwrap();
        let packed = Packed::new(&json);
        let alone = miniz_oxide::deflate::compress_to_vec(&json, Packed::LEVEL as u8).len();
        assert_eq!(packed.json(), json);
        assert!(packed.len() * 2 < alone, "{} bytes packed, {alone} deflated alone", packed.len());
    }

    /// A status the controller wrote in `cargo xtask bench scale`, as the API server showed it.
    const SAMPLE: &str = r#"{"appliedChecksum": "v3:70f24d56988345722be23b45204aaca64ea7579d183aa280d4d64ea96c26c048", "conditions": [{"lastTransitionTime": "2026-11-29T01:49:40Z", "message": "read 1 key from Consul", "observedGeneration": 1, "reason": "Synced", "status": "True", "type": "ConsulSynced"}, {"lastTransitionTime": "2026-11-29T01:49:40Z", "message": "1 target carries the applied content", "observedGeneration": 1, "reason": "UpToDate", "status": "True", "type": "TargetsUpdated"}, {"lastTransitionTime": "2026-11-29T01:49:40Z", "message": "1 target carries the current content", "observedGeneration": 1, "reason": "UpToDate", "status": "True", "type": "Ready"}, {"lastTransitionTime": "2026-11-29T01:49:40Z", "message": "no work is under way", "observedGeneration": 1, "reason": "UpToDate", "status": "False", "type": "Reconciling"}, {"lastTransitionTime": "2026-11-29T01:49:40Z", "message": "nothing waits for a person", "observedGeneration": 1, "reason": "UpToDate", "status": "False", "type": "Stalled"}], "keySummary": "1/1", "keys": [{"checksum": "v3:70f24d56988345722be23b45204aaca64ea7579d183aa280d4d64ea96c26c048", "key": "bench-scale-5176/k00043", "modifyIndex": 70829, "present": true}], "lastChangeTime": "2026-11-29T01:50:32Z", "lastSyncTime": "2026-11-29T01:50:32Z", "observedGeneration": 1, "observedSpec": "96a8af0d71342a64", "shortChecksum": "70f24d569883", "targetSummary": "1/1", "targets": [{"checksum": "v3:70f24d56988345722be23b45204aaca64ea7579d183aa280d4d64ea96c26c048", "kind": "Deployment", "lastRolledTime": "2026-11-29T01:50:32.981131Z", "name": "w00043", "uid": "07758b22-cb9a-4dad-8e77-c076dce68225"}]}"#;
}
