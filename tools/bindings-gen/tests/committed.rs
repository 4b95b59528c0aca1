//! Every committed binding equals what bindgen makes from its header today.
use keel_bindings_gen::{generate, repo_root, BINDINGS};

#[test]
fn committed_bindings_match_their_headers() {
    for b in BINDINGS {
        let made = generate(b).unwrap_or_else(|e| panic!("{e}"));
        let path = repo_root().join(b.output);
        let committed = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}: run `cargo run -p keel-bindings-gen -- --write {}`", path.display(), b.name));
        assert!(
            committed == made,
            "{} differs from what {} gives: run `cargo run -p keel-bindings-gen -- --write {}` and review the diff",
            b.output, b.header, b.name
        );
    }
}
