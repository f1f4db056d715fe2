//! What the controllers' events.k8s.io Events share: the reference to a claim, and a note the
//! API server accepts.

use k8s_openapi::api::core::v1::ObjectReference;

/// The API server refuses notes over 1 kB.
const NOTE_LIMIT: usize = 1024;

/// `text`, cut (at a character boundary, marked "...") to fit an Event's note.
pub fn note(mut text: String) -> String {
    if text.len() > NOTE_LIMIT {
        let mut cut = NOTE_LIMIT - 3;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("...");
    }
    text
}

/// An Event's `regarding` for a claim.
pub fn claim(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        uid: Some(uid.into()),
        ..ObjectReference::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_notes_are_cut_at_a_character_boundary() {
        assert_eq!(note("short".into()), "short");
        let long = "é".repeat(600);
        let cut = note(long);
        assert!(
            cut.len() <= NOTE_LIMIT && cut.ends_with("..."),
            "{}",
            cut.len()
        );
    }
}
