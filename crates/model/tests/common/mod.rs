//! Finding the real checkpoints for tests (see `kvlab_model::registry::test_model_file`): a missing
//! file is a loud skip, or a failure when `KVLAB_REQUIRE_MODELS=1`.

pub use kvlab_model::registry::test_model_file as model_file;
