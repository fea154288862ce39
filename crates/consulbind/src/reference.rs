//! The book's generated reference pages: each is made by a unit test from what the code
//! declares, and that test fails while the committed page differs.

/// Holds the committed page at `path` (relative to the workspace) to `page`, or writes it when
/// `CONSULBIND_WRITE_REFERENCE=1`. `test` is the filter of the test that makes it.
pub fn hold(path: &str, page: &str, test: &str) {
    let file = format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR"));
    if std::env::var("CONSULBIND_WRITE_REFERENCE").as_deref() == Ok("1") {
        std::fs::write(&file, page).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&file).unwrap_or_default();
    let first_difference = committed.lines().zip(page.lines()).find(|(old, new)| old != new);
    assert!(
        committed == page,
        "{path} is not what the code makes of it (first difference: {first_difference:?}); run \
         CONSULBIND_WRITE_REFERENCE=1 cargo test -p consulbind --lib {test} and commit the page"
    );
}
