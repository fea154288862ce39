//! Names the controller writes onto workloads, one set per binding.

use sha2::{Digest, Sha256};

/// Prefix of every pod-template annotation the controller owns.
pub const ANNOTATION_PREFIX: &str = "checksum.consulbind.dev";

const NAME_MAX: usize = 63;

/// The pod-template annotation owned by the binding `name`. Bindings in one namespace never
/// share a key, so two bindings on one workload never fight over it.
pub fn annotation_key(binding: &str) -> String {
    format!("{ANNOTATION_PREFIX}/{}", name_part(binding))
}

/// The server-side apply field manager for stamping workloads for the binding `name`. Each
/// binding applies as its own manager, so applying one binding's annotation never removes
/// another's.
pub fn field_manager(binding: &str) -> String {
    format!("consulbind-{}", name_part(binding))
}

/// The field manager of a write that stamps the annotations of several bindings at once. No
/// binding's own manager has this name.
pub const JOINT_MANAGER: &str = "consulbind";

/// Binding names may be 253 characters; an annotation name part may be 63. Long names keep a
/// readable head and a hash of the whole name, joined by `_`, which no binding name has: no
/// binding can be given the name part of another.
fn name_part(binding: &str) -> String {
    if binding.len() <= NAME_MAX {
        return binding.to_owned();
    }
    let hash = Sha256::digest(binding.as_bytes());
    let suffix: String = hash[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("{}_{suffix}", &binding[..NAME_MAX - 1 - suffix.len()])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid_name_part(s: &str) -> bool {
        let bytes = s.as_bytes();
        !s.is_empty()
            && s.len() <= NAME_MAX
            && bytes[0].is_ascii_alphanumeric()
            && bytes[bytes.len() - 1].is_ascii_alphanumeric()
            && bytes.iter().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(b))
    }

    #[test]
    fn short_names_are_kept() {
        assert_eq!(annotation_key("web-config"), "checksum.consulbind.dev/web-config");
        assert_eq!(field_manager("web-config"), "consulbind-web-config");
    }

    #[test]
    fn long_names_stay_valid_and_distinct() {
        let a = "a".repeat(200) + ".x";
        let b = "a".repeat(200) + ".y";
        let (ka, kb) = (annotation_key(&a), annotation_key(&b));
        assert_ne!(ka, kb);
        for key in [&ka, &kb] {
            let part = key.split_once('/').unwrap().1;
            assert!(valid_name_part(part), "{part}");
        }
        assert!(field_manager(&a).len() <= 128);
        // A binding named as the long one's name part is a valid name, and gets a key of its own.
        let short = annotation_key(&a).split_once('/').unwrap().1.replace('_', "-");
        assert_eq!(short.len(), NAME_MAX);
        assert_ne!(annotation_key(&short), ka);
        assert_ne!(field_manager(&short), field_manager(&a));
    }
}
