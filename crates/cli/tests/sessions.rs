//! Saved sessions (`kvlab serve --slot-save-path`, `POST /slots/{id}?action=save|restore`): a
//! conversation saved, the server restarted, the conversation restored and continued gives the
//! tokens of the uninterrupted conversation, from restored blocks; a file of another KV layout,
//! or a corrupt one, is refused with a clear error.

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

mod common;

use common::Server;
use serde_json::json;

const TURN_1: &str = "Once upon a time there was a little girl named Lily. She loved to play outside in the park with her friends.";

#[test]
fn a_saved_conversation_survives_a_restart_with_the_uninterrupted_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let flags = ["--slot-save-path", path];
    let (reply, next, want) = {
        let a = Server::start("stories260K", &flags);
        let (reply, _) = a.complete(TURN_1);
        let conversation = format!("{TURN_1}{reply}");
        let (s, saved) = a.post(
            "/slots/0?action=save",
            &json!({"filename": "lily", "prompt": conversation}),
        );
        assert_eq!(s, 200, "{saved}");
        assert!(saved["n_saved"].as_u64().unwrap() >= 32, "{saved}");
        assert!(saved["n_written"].as_u64().unwrap() > 0, "{saved}");
        // The uninterrupted conversation's next turn.
        let next = format!("{conversation} Then she");
        let (want, _) = a.complete(&next);
        (reply, next, want)
    };
    assert!(!reply.is_empty());
    // A restarted server: nothing cached until the session is restored.
    let b = Server::start("stories260K", &flags);
    let (s, restored) = b.post("/slots/7?action=restore", &json!({"filename": "lily"}));
    assert_eq!(s, 200, "{restored}");
    assert_eq!(restored["id_slot"], 7);
    assert!(restored["n_restored"].as_u64().unwrap() >= 32, "{restored}");
    let (text, cached) = b.complete(&next);
    assert_eq!(
        text, want,
        "the restored conversation continues as the uninterrupted one"
    );
    assert!(
        cached >= 32,
        "its history came from the saved blocks, not a prefill"
    );

    // Another KV layout (another namespace) is refused, naming both.
    let f16 = Server::start(
        "stories260K",
        &["--slot-save-path", path, "--kv-dtype", "f16"],
    );
    let (s, e) = f16.post("/slots/0?action=restore", &json!({"filename": "lily"}));
    assert_eq!(s, 400, "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("kv_dtype=f32") && msg.contains("kv_dtype=f16"),
        "{msg}"
    );
    // A corrupt file is refused, and so are names that leave the directory and unknown files.
    let file = dir.path().join("lily");
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    std::fs::write(dir.path().join("bad"), bytes).unwrap();
    for (name, why) in [
        ("bad", "checksum"),
        ("../lily", "plain file name"),
        ("missing", "missing"),
    ] {
        let (s, e) = b.post("/slots/0?action=restore", &json!({"filename": name}));
        assert_eq!(s, 400, "{name}: {e}");
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(msg.contains(why) || name == "missing", "{name}: {msg}");
    }
    let (s, _) = b.post("/slots/0?action=erase", &json!({"filename": "lily"}));
    assert_eq!(s, 400, "only save and restore");
    // Without --slot-save-path there are no sessions.
    let plain = Server::start("stories260K", &[]);
    let (s, e) = plain.post(
        "/slots/0?action=save",
        &json!({"filename": "x", "prompt": "Hi"}),
    );
    assert_eq!(s, 400);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--slot-save-path")
    );
}
