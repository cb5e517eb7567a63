//! Generated review bodies for the differential test of `/mutate`'s two reads (test only).
//!
//! The fast read ([`crate::podview`]) must take no body the whole `Value` read refuses, and must
//! answer every body it takes as the whole read does. Hand-picked bodies test the shapes we
//! thought of; these are the ones we did not: pods built at random from the fields the mutation
//! reads, each field sometimes of a wrong type, repeated (once with its key escaped), or absent,
//! quantities as strings and as JSON numbers, with unknown keys and odd `oldObject`s and kinds.

/// A field of a generated object: its key and how to make its value.
type Field<'a> = (&'a str, &'a dyn Fn(&mut Gen) -> String);

/// A small deterministic generator (xorshift64), so that a failure names a reproducible body.
pub struct Gen(u64);

impl Gen {
    /// A generator from a non-zero seed.
    pub fn new(seed: u64) -> Gen {
        Gen(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True `pct` times in a hundred.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.next() % 100 < pct
    }

    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len())]
    }

    /// A JSON string of one of `xs`, sometimes with its first character written as a `\u` escape.
    fn string(&mut self, xs: &[&str]) -> String {
        let s = self.pick(xs);
        match s.chars().next() {
            Some(c) if self.chance(10) => format!("\"\\u{:04x}{}\"", c as u32, &s[c.len_utf8()..]),
            _ => format!("\"{s}\""),
        }
    }

    /// A value of a type the field may not have.
    fn odd(&mut self) -> String {
        self.pick(&[
            "null",
            "1",
            "-3",
            "1.5",
            "1e2",
            "-0",
            "18446744073709551616",
            "true",
            "\"x\"",
            "\"\"",
            "[]",
            "{}",
            "[1]",
            "{\"a\":1}",
            "\"\\u00e9\"",
            "\"4Gi\"",
            "\"default-scheduler\"",
        ])
        .to_string()
    }

    /// An object of some of `fields` in random order, each now and then odd, one now and then
    /// repeated, and now and then an unknown key.
    fn object(&mut self, fields: &[Field<'_>]) -> String {
        let mut parts = Vec::new();
        for (k, f) in fields {
            if self.chance(75) {
                let v = if self.chance(4) { self.odd() } else { f(self) };
                parts.push(format!("{}:{v}", self.string(&[k])));
            }
        }
        if self.chance(8) {
            let (k, f) = fields[self.below(fields.len())];
            let v = f(self);
            parts.push(format!("{}:{v}", self.string(&[k])));
        }
        for i in (1..parts.len()).rev() {
            let j = self.below(i + 1);
            parts.swap(i, j);
        }
        if self.chance(20) {
            parts.push(format!("\"zz\":{}", self.odd()));
        }
        format!("{{{}}}", parts.join(","))
    }

    fn list(&mut self, item: &dyn Fn(&mut Gen) -> String) -> String {
        let items: Vec<String> = (0..self.below(4))
            .map(|_| {
                if self.chance(5) {
                    self.odd()
                } else {
                    item(self)
                }
            })
            .collect();
        format!("[{}]", items.join(","))
    }

    fn quantity(&mut self) -> String {
        if self.chance(50) {
            self.string(&[
                "1", "2", "0", "4096", "4Gi", "50", "30", "100", "150", "1.5", "-1", "",
            ])
        } else {
            self.pick(&["1", "2", "0", "4096", "50", "1.0", "-1", "1e2", "-0", "3.7"])
                .to_string()
        }
    }

    fn resource_map(&mut self) -> String {
        let names = [
            "nvidia.com/gpu",
            "nvidia.com/gpumem",
            "nvidia.com/gpucores",
            "nvidia.com/gpumem-percentage",
            "cpu",
            "memory",
        ];
        let mut parts = Vec::new();
        for k in names {
            if self.chance(if k.starts_with("nvidia") { 45 } else { 25 }) {
                parts.push(format!("{}:{}", self.string(&[k]), self.quantity()));
            }
        }
        if self.chance(3) {
            let k = self.pick(&names);
            parts.push(format!("{}:{}", self.string(&[k]), self.quantity()));
        }
        format!("{{{}}}", parts.join(","))
    }

    fn env_entry(&mut self) -> String {
        self.object(&[
            ("name", &|g| {
                g.string(&[
                    "CUDA_DEVICE_MEMORY_LIMIT",
                    "CUDA_DEVICE_SM_LIMIT",
                    "A",
                    "LD_PRELOAD",
                ])
            }),
            ("value", &|g| g.string(&["4096m", "0", "30", "x", "1024m"])),
            ("valueFrom", &|g| {
                if g.chance(50) {
                    "null"
                } else {
                    "{\"fieldRef\":{}}"
                }
                .to_string()
            }),
        ])
    }

    fn container(&mut self) -> String {
        self.object(&[
            ("name", &|g| g.string(&["c", "d", ""])),
            ("resources", &|g| {
                g.object(&[
                    ("limits", &|g| g.resource_map()),
                    ("requests", &|g| g.resource_map()),
                    ("claims", &|_| "[]".to_string()),
                ])
            }),
            ("env", &|g| g.list(&|g| g.env_entry())),
            ("image", &|_| "\"i\"".to_string()),
        ])
    }

    /// A pod object.
    pub fn pod(&mut self) -> String {
        self.object(&[
            ("metadata", &|g| {
                g.object(&[
                    ("name", &|g| g.string(&["p", "", "q"])),
                    ("generateName", &|g| g.string(&["g-", ""])),
                    ("labels", &|g| {
                        g.object(&[
                            ("vgpu.io/managed", &|g| g.string(&["true", "false"])),
                            ("app", &|_| "\"x\"".to_string()),
                        ])
                    }),
                    ("annotations", &|g| {
                        g.object(&[("vgpu.io/injected", &|g| g.string(&["m", ""]))])
                    }),
                ])
            }),
            ("spec", &|g| {
                g.object(&[
                    ("containers", &|g| g.list(&|g| g.container())),
                    ("initContainers", &|g| g.list(&|g| g.container())),
                    ("ephemeralContainers", &|g| g.list(&|g| g.container())),
                    ("schedulerName", &|g| {
                        g.string(&["", "default-scheduler", "vgpu-scheduler", "volcano"])
                    }),
                    ("runtimeClassName", &|g| g.string(&["", "vgpu", "other"])),
                ])
            }),
            ("status", &|_| "{\"phase\":\"Pending\"}".to_string()),
        ])
    }

    /// An AdmissionReview of `object` (mostly a Pod CREATE).
    pub fn review(&mut self, object: &str) -> String {
        let old = if self.chance(20) {
            let o = if self.chance(50) {
                self.odd()
            } else {
                self.pod()
            };
            format!(",\"oldObject\":{o}")
        } else {
            String::new()
        };
        let kind = if self.chance(90) { "Pod" } else { "Deployment" };
        let op = if self.chance(90) { "CREATE" } else { "UPDATE" };
        let name = if self.chance(50) {
            ",\"name\":\"rn\""
        } else {
            ""
        };
        format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u","kind":{{"group":"","version":"v1","kind":"{kind}"}},"operation":"{op}","namespace":"ns"{name},"object":{object}{old}}}}}"#
        )
    }
}
