//! Test double of kube-apiserver: HTTPS, Kubernetes JSON, list/watch, optimistic concurrency (to be written).
