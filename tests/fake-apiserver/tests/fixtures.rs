//! The double answers what the real API server answered: each case replays a request captured from
//! kube-apiserver v1.36 by the real-cluster tier (tests/fixtures/apiserver/) and compares the
//! answer's code, reason and message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use vgpu_fake_apiserver::FakeApiServer;

fn fixture(name: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/apiserver")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

#[tokio::test]
async fn an_event_about_a_cluster_scoped_object_in_a_namespace_is_refused_as_the_real_one_is() {
    let f = fixture("event-cluster-scoped-in-namespace.json");
    let api = FakeApiServer::start().await.unwrap();
    let e = api.create(f["request"].clone()).unwrap_err();
    let status = &f["status"];
    assert_eq!(Value::from(e.code), status["code"]);
    assert_eq!(e.reason, status["reason"]);
    assert_eq!(Value::from(e.message), status["message"]);
    // The same Event about the pod in its own namespace is taken.
    let mut ok = f["request"].clone();
    let ns = ok["metadata"]["namespace"].clone();
    ok["regarding"] =
        serde_json::json!({"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": "p"});
    api.create(ok).unwrap();
}
