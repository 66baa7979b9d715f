//! The manifest and the shipped default model: a fresh clone finds stories260K with no
//! `KVLAB_MODELS` and no network, and the shipped files are the manifest's, byte for byte.

use kvlab_model::registry::{self, Located};

#[test]
fn shipped_default_model_matches_the_manifest() {
    let dir = registry::shipped_dir().expect("fixtures/models/ is in the repository");
    let entry = registry::entry("stories260K").unwrap();
    for f in [entry.model.as_ref(), entry.tokenizer.as_ref()] {
        let f = f.unwrap();
        let p = dir.join(&f.file);
        let shown = p.display();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), f.bytes, "{shown}");
        assert_eq!(registry::sha256_file(&p).unwrap(), f.sha256, "{shown}");
    }
}

#[test]
fn stories260k_is_always_found_and_searched_last_in_the_shipped_copy() {
    match registry::locate("stories260K").unwrap() {
        Located::Ready {
            model, tokenizer, ..
        } => {
            let (m, t) = (model.unwrap(), tokenizer.unwrap());
            let loaded = registry::load_llama2c(&m, Some(&t)).unwrap();
            assert_eq!(loaded.0.config.dim, 64);
        }
        Located::Missing { searched, .. } => panic!("stories260K not found in {searched}"),
    }
    // The shipped folder is the last place searched: KVLAB_MODELS and the user cache win.
    let dirs = registry::search_dirs();
    assert_eq!(dirs.last(), registry::shipped_dir().as_ref());
    assert_eq!(dirs[dirs.len() - 2], registry::cache_dir());
}

#[test]
fn a_model_the_clone_lacks_is_reported_with_the_places_searched() {
    let entry = registry::entry("gemma-3-270m").unwrap();
    let f = entry.model.as_ref().unwrap();
    let searched = registry::searched_places(f);
    assert!(
        searched.contains(&registry::cache_dir().display().to_string()),
        "{searched}"
    );
}
