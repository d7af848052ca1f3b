//! Kubernetes protobuf (`application/vnd.kubernetes.protobuf`) for the
//! built-in kinds, as the real API server speaks it to client-go,
//! controller-runtime and kubectl.
//!
//! The server keeps objects as JSON; this module converts at the edge. The
//! layout of every message (field numbers, wire types, JSON names, which
//! structs Go embeds inline) is in `schema.txt`, generated from the k8s-pb
//! crate's messages and k8s-openapi's JSON names by
//! `tests/sim/proto/generate.py`; `tests/sim/tests/protobuf.rs` checks it
//! against k8s-pb's own (prost) encoder. The wire primitives are prost's.
//!
//! The JSON side follows the real server's Go types:
//! - `Time` is RFC 3339 in seconds, `MicroTime` in microseconds, a zero time
//!   is left out (Go writes `null`);
//! - `Quantity` is a string, `IntOrString` a number or a string,
//!   `RawExtension` and `FieldsV1` the JSON they carry, `Duration` Go's
//!   duration text, `ExtraValue`/`Verbs` a list of strings, bytes base64;
//! - a zero scalar ("", 0, false) from a protobuf body is left out, as Go's
//!   JSON encoder omits it (`omitempty`); Go's protobuf encoder writes every
//!   non-pointer field, so the wire cannot tell "unset" from "zero". Kept
//!   are the fields Go always writes (no `omitempty`: k8s-openapi's
//!   required fields, marked `!` in the schema) and the pointer fields in
//!   [`KEEP_ZERO`], whose explicit 0 or false means something
//!   (`replicas: 0`, `gracePeriodSeconds: 0`, `runAsUser: 0`...).

use std::collections::HashMap;

use base64::Engine;
use bytes::Buf;
use prost::encoding::{WireType, decode_key, decode_varint, encode_key, encode_varint};
use serde_json::{Map, Value, json};

/// The media type.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";
/// The media type of a protobuf watch stream (length-prefixed frames).
pub const WATCH_MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";
/// Every protobuf body starts with these four bytes.
const MAGIC: &[u8] = b"k8s\0";

const TIME: &str = "apimachinery.pkg.apis.meta.v1.Time";
const MICRO_TIME: &str = "apimachinery.pkg.apis.meta.v1.MicroTime";
const DURATION: &str = "apimachinery.pkg.apis.meta.v1.Duration";
const QUANTITY: &str = "apimachinery.pkg.api.resource.Quantity";
const INT_OR_STRING: &str = "apimachinery.pkg.util.intstr.IntOrString";
const RAW_EXTENSION: &str = "apimachinery.pkg.runtime.RawExtension";
const FIELDS_V1: &str = "apimachinery.pkg.apis.meta.v1.FieldsV1";
const META: &str = "apimachinery.pkg.apis.meta.v1";

/// A body that could not be converted.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error(
        "provided data does not appear to be a protobuf message, expected prefix [107 56 115 0]"
    )]
    NoPrefix,
    #[error("malformed protobuf: {0}")]
    Wire(String),
    #[error("no protobuf message for kind {kind:?} in {api_version:?}")]
    UnknownKind { api_version: String, kind: String },
    #[error("the object has no apiVersion and kind")]
    NoKind,
}

impl From<prost::DecodeError> for ProtoError {
    fn from(e: prost::DecodeError) -> Self {
        ProtoError::Wire(e.to_string())
    }
}

/// Pointer fields (`*int32`, `*bool` in Go) whose explicit zero differs from
/// unset, by JSON name: a 0 or false for them in a protobuf body is kept.
/// Every other zero number or false is the Go zero value and is left out.
pub const KEEP_ZERO: &[&str] = &[
    "activeDeadlineSeconds",
    "allowPrivilegeEscalation",
    "automountServiceAccountToken",
    "backoffLimit",
    "backoffLimitPerIndex",
    "completions",
    "defaultMode",
    "deletionGracePeriodSeconds",
    "enableServiceLinks",
    "expirationSeconds",
    "failedJobsHistoryLimit",
    "fsGroup",
    "gracePeriodSeconds",
    "hostUsers",
    "leaseDurationSeconds",
    "leaseTransitions",
    "maxFailedIndexes",
    "minReadySeconds",
    "mode",
    "optional",
    "orphanDependents",
    "parallelism",
    "partition",
    "priority",
    "privileged",
    "progressDeadlineSeconds",
    "readOnlyRootFilesystem",
    "replicas",
    "revisionHistoryLimit",
    "runAsGroup",
    "runAsNonRoot",
    "runAsUser",
    "setHostnameAsFQDN",
    "shareProcessNamespace",
    "startingDeadlineSeconds",
    "successfulJobsHistoryLimit",
    "suspend",
    "terminationGracePeriodSeconds",
    "timeoutSeconds",
    "tolerationSeconds",
    "ttlSecondsAfterFinished",
];

#[derive(Debug, Clone)]
enum Ty {
    String,
    Int32,
    Int64,
    Bool,
    Bytes,
    Double,
    Message(String),
    /// A Go struct embedded inline: its fields sit in the parent's JSON.
    Inline(String),
    MapString,
    MapBytes,
    MapMessage(String),
}

#[derive(Debug, Clone)]
struct Field {
    tag: u32,
    json: String,
    ty: Ty,
    repeated: bool,
    /// A zero value read from the wire is kept in the JSON.
    keep_zero: bool,
}

/// The protobuf layout of the built-in kinds.
#[derive(Debug, Default)]
pub struct Schema {
    messages: HashMap<String, Vec<Field>>,
    /// (apiVersion, kind) -> message, for the kinds with a REST resource.
    kinds: HashMap<(String, String), String>,
    /// apiVersion -> module, e.g. `apps/v1` -> `api.apps.v1`.
    modules: HashMap<String, String>,
    /// lowercased full name -> message (k8s-pb writes `ApiResource`).
    folded: HashMap<String, String>,
}

impl Schema {
    /// The schema of the built-in kinds nmo-sim serves.
    pub fn builtin() -> Self {
        Self::parse(include_str!("schema.txt"))
    }

    fn parse(text: &str) -> Self {
        let mut s = Schema::default();
        let mut current: Option<String> = None;
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let parts: Vec<&str> = line.split(' ').collect();
            match parts.as_slice() {
                ["R", av, kind, msg] => {
                    s.kinds
                        .insert(((*av).into(), (*kind).into()), (*msg).into());
                    if let Some((module, _)) = msg.rsplit_once('.') {
                        s.modules.insert((*av).into(), module.into());
                    }
                }
                ["M", msg] => {
                    s.messages.insert((*msg).into(), Vec::new());
                    s.folded.insert(msg.to_lowercase(), (*msg).into());
                    current = Some((*msg).into());
                }
                [tag, json, ty, rest @ ..] => {
                    let Some(msg) = current.as_ref() else {
                        continue;
                    };
                    let target = rest.first().map(|t| (*t).to_owned()).unwrap_or_default();
                    let (ty, required) = match ty.strip_suffix('!') {
                        Some(t) => (t, true),
                        None => (*ty, false),
                    };
                    let (ty, repeated) = match ty.strip_suffix('*') {
                        Some(t) => (t, true),
                        None => (ty, false),
                    };
                    let ty = match ty {
                        "string" => Ty::String,
                        "int32" => Ty::Int32,
                        "int64" => Ty::Int64,
                        "bool" => Ty::Bool,
                        "bytes" => Ty::Bytes,
                        "double" => Ty::Double,
                        "message" => Ty::Message(target),
                        "inline" => Ty::Inline(target),
                        "map:string" => Ty::MapString,
                        "map:bytes" => Ty::MapBytes,
                        "map:message" => Ty::MapMessage(target),
                        _ => continue,
                    };
                    let Ok(tag) = tag.parse() else { continue };
                    if let Some(fields) = s.messages.get_mut(msg) {
                        fields.push(Field {
                            tag,
                            json: (*json).into(),
                            ty,
                            repeated,
                            keep_zero: required || KEEP_ZERO.contains(json),
                        });
                    }
                }
                _ => {}
            }
        }
        s
    }

    /// The message of an object's kind, if it has one.
    pub fn message_for(&self, api_version: &str, kind: &str) -> Option<&str> {
        if let Some(m) = self.kinds.get(&(api_version.into(), kind.into())) {
            return Some(m);
        }
        if let Some(item) = kind.strip_suffix("List")
            && let Some(m) = self.kinds.get(&(api_version.into(), item.into()))
        {
            return self
                .folded
                .get(&format!("{m}list").to_lowercase())
                .map(String::as_str);
        }
        let module = match api_version {
            "meta.k8s.io/v1" => META,
            av => self.modules.get(av).map_or(META, String::as_str),
        };
        self.folded
            .get(&format!("{module}.{kind}").to_lowercase())
            .or_else(|| self.folded.get(&format!("{META}.{kind}").to_lowercase()))
            .map(String::as_str)
    }

    /// Whether objects of this kind can be sent as protobuf.
    pub fn supports(&self, api_version: &str, kind: &str) -> bool {
        self.message_for(api_version, kind).is_some()
    }

    /// A protobuf request body (`k8s\0` + runtime.Unknown) as the JSON
    /// object it carries, with its apiVersion and kind.
    pub fn decode_object(&self, body: &[u8]) -> Result<Value, ProtoError> {
        let (api_version, kind, raw) = unwrap_unknown(body)?;
        let msg = self
            .message_for(&api_version, &kind)
            .ok_or_else(|| ProtoError::UnknownKind {
                api_version: api_version.clone(),
                kind: kind.clone(),
            })?;
        let mut obj = self.decode_message(msg, &raw)?;
        if let Value::Object(m) = &mut obj {
            m.insert("apiVersion".into(), json!(api_version));
            m.insert("kind".into(), json!(kind));
        }
        Ok(obj)
    }

    /// An object (with apiVersion and kind) as a protobuf body.
    pub fn encode_object(&self, obj: &Value) -> Result<Vec<u8>, ProtoError> {
        let api_version = obj["apiVersion"].as_str().ok_or(ProtoError::NoKind)?;
        let kind = obj["kind"].as_str().ok_or(ProtoError::NoKind)?;
        let msg = self
            .message_for(api_version, kind)
            .ok_or_else(|| ProtoError::UnknownKind {
                api_version: api_version.into(),
                kind: kind.into(),
            })?;
        let raw = self.encode_message(msg, obj);
        Ok(wrap_unknown(api_version, kind, &raw))
    }

    /// One frame of a protobuf watch: a 4-byte big-endian length, then a
    /// bare `WatchEvent` message (no `k8s\0` envelope: the real server's
    /// stream serializer is the raw protobuf one) whose object is itself a
    /// full protobuf body, envelope included. client-go's watch decoder
    /// fails on an enveloped frame ("proto: illegal wireType 7").
    pub fn encode_watch_event(&self, event_type: &str, obj: &Value) -> Result<Vec<u8>, ProtoError> {
        let inner = self.encode_object(obj)?;
        let mut raw_ext = Vec::new();
        put_bytes(&mut raw_ext, 1, &inner);
        let mut event = Vec::new();
        put_bytes(&mut event, 1, event_type.as_bytes());
        put_bytes(&mut event, 2, &raw_ext);
        let mut frame = (event.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&event);
        Ok(frame)
    }

    /// Decodes one message's bytes to JSON.
    pub fn decode_message(&self, msg: &str, mut buf: &[u8]) -> Result<Value, ProtoError> {
        let mut out = Map::new();
        self.decode_into(msg, &mut buf, &mut out, 0)?;
        Ok(Value::Object(out))
    }

    fn decode_into(
        &self,
        msg: &str,
        buf: &mut &[u8],
        out: &mut Map<String, Value>,
        depth: usize,
    ) -> Result<(), ProtoError> {
        if depth > 64 {
            return Err(ProtoError::Wire("nested too deeply".into()));
        }
        let fields = self.messages.get(msg);
        while buf.has_remaining() {
            let (tag, wire) = decode_key(buf)?;
            let Some(field) = fields.and_then(|f| f.iter().find(|x| x.tag == tag)) else {
                skip(buf, wire)?;
                continue;
            };
            // Packed repeated scalars (proto3 writers) as well as unpacked.
            if field.repeated
                && wire == WireType::LengthDelimited
                && matches!(field.ty, Ty::Int32 | Ty::Int64 | Ty::Bool | Ty::Double)
            {
                let mut packed = take_bytes(buf)?;
                while packed.has_remaining() {
                    let v = scalar(&field.ty, &mut packed, scalar_wire(&field.ty))?;
                    push(out, &field.json, v, true);
                }
                continue;
            }
            let value = match &field.ty {
                Ty::String => {
                    let b = take_bytes(buf)?;
                    let s = String::from_utf8_lossy(b).into_owned();
                    if s.is_empty() && !field.repeated && !field.keep_zero {
                        continue;
                    }
                    Value::String(s)
                }
                Ty::Bytes => Value::String(
                    base64::engine::general_purpose::STANDARD.encode(take_bytes(buf)?),
                ),
                Ty::Int32 | Ty::Int64 | Ty::Bool | Ty::Double => {
                    let v = scalar(&field.ty, buf, wire)?;
                    let zero = v == json!(0) || v == json!(false) || v == json!(0.0);
                    if zero && !field.repeated && !field.keep_zero {
                        continue;
                    }
                    v
                }
                Ty::Message(m) => {
                    let b = take_bytes(buf)?;
                    match self.decode_special(m, b, depth)? {
                        Some(v) => v,
                        None => continue,
                    }
                }
                Ty::Inline(m) => {
                    let mut b = take_bytes(buf)?;
                    self.decode_into(m, &mut b, out, depth + 1)?;
                    continue;
                }
                Ty::MapString | Ty::MapBytes | Ty::MapMessage(_) => {
                    let mut entry = take_bytes(buf)?;
                    let (k, v) = self.map_entry(&field.ty, &mut entry, depth)?;
                    let map = out
                        .entry(field.json.clone())
                        .or_insert_with(|| Value::Object(Map::new()));
                    if let Value::Object(m) = map {
                        m.insert(k, v);
                    }
                    continue;
                }
            };
            push(out, &field.json, value, field.repeated);
        }
        Ok(())
    }

    fn map_entry(
        &self,
        ty: &Ty,
        entry: &mut &[u8],
        depth: usize,
    ) -> Result<(String, Value), ProtoError> {
        let mut key = String::new();
        let mut value = match ty {
            Ty::MapMessage(m) => self.decode_special(m, &[], depth)?.unwrap_or(Value::Null),
            _ => Value::String(String::new()),
        };
        while entry.has_remaining() {
            let (tag, wire) = decode_key(entry)?;
            match tag {
                1 => key = String::from_utf8_lossy(take_bytes(entry)?).into_owned(),
                2 => {
                    let b = take_bytes(entry)?;
                    value = match ty {
                        Ty::MapString => Value::String(String::from_utf8_lossy(b).into_owned()),
                        Ty::MapBytes => {
                            Value::String(base64::engine::general_purpose::STANDARD.encode(b))
                        }
                        Ty::MapMessage(m) => {
                            self.decode_special(m, b, depth)?.unwrap_or(Value::Null)
                        }
                        _ => Value::Null,
                    }
                }
                _ => skip(entry, wire)?,
            }
        }
        Ok((key, value))
    }

    /// A message field's JSON, with the types whose JSON is not an object.
    /// None: leave the field out (a zero time).
    fn decode_special(
        &self,
        msg: &str,
        b: &[u8],
        depth: usize,
    ) -> Result<Option<Value>, ProtoError> {
        let plain = |s: &Self| -> Result<Map<String, Value>, ProtoError> {
            let mut out = Map::new();
            let mut b = b;
            s.decode_into(msg, &mut b, &mut out, depth + 1)?;
            Ok(out)
        };
        Ok(Some(match msg {
            TIME | MICRO_TIME => {
                let m = plain(self)?;
                let secs = m.get("seconds").and_then(Value::as_i64).unwrap_or(0);
                let nanos = m.get("nanos").and_then(Value::as_i64).unwrap_or(0);
                if secs == 0 && nanos == 0 {
                    return Ok(None);
                }
                let Ok(ts) = jiff::Timestamp::new(secs, nanos as i32) else {
                    return Err(ProtoError::Wire(format!("time out of range: {secs}s")));
                };
                Value::String(if msg == TIME {
                    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
                } else {
                    ts.strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string()
                })
            }
            DURATION => {
                let m = plain(self)?;
                Value::String(go_duration(
                    m.get("duration").and_then(Value::as_i64).unwrap_or(0),
                ))
            }
            QUANTITY => plain(self)?.remove("string").unwrap_or(json!("0")),
            INT_OR_STRING => {
                let m = plain(self)?;
                if m.get("type").and_then(Value::as_i64) == Some(1) {
                    m.get("strVal").cloned().unwrap_or(json!(""))
                } else {
                    m.get("intVal").cloned().unwrap_or(json!(0))
                }
            }
            RAW_EXTENSION | FIELDS_V1 => {
                let mut raw: &[u8] = b;
                let mut bytes: &[u8] = &[];
                while raw.has_remaining() {
                    let (tag, wire) = decode_key(&mut raw)?;
                    if tag == 1 {
                        bytes = take_bytes(&mut raw)?;
                    } else {
                        skip(&mut raw, wire)?;
                    }
                }
                if bytes.is_empty() {
                    return Ok(None);
                }
                if bytes.starts_with(MAGIC) {
                    let (av, kind, raw) = unwrap_unknown(bytes)?;
                    let mut obj = match self.message_for(&av, &kind) {
                        Some(m) => self.decode_message(m, &raw)?,
                        None => serde_json::from_slice(&raw).unwrap_or(Value::Null),
                    };
                    obj["apiVersion"] = json!(av);
                    obj["kind"] = json!(kind);
                    obj
                } else {
                    serde_json::from_slice(bytes)
                        .map_err(|e| ProtoError::Wire(format!("embedded JSON: {e}")))?
                }
            }
            m if is_string_list(m) => plain(self)?.remove("items").unwrap_or(json!([])),
            _ => Value::Object(plain(self)?),
        }))
    }

    /// Encodes a JSON object as one message's bytes.
    pub fn encode_message(&self, msg: &str, obj: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(msg, obj, &mut out, 0);
        out
    }

    fn encode_into(&self, msg: &str, obj: &Value, out: &mut Vec<u8>, depth: usize) {
        if depth > 64 {
            return;
        }
        let Some(fields) = self.messages.get(msg) else {
            return;
        };
        for f in fields {
            if let Ty::Inline(m) = &f.ty {
                let mut inner = Vec::new();
                self.encode_into(m, obj, &mut inner, depth + 1);
                put_bytes(out, f.tag, &inner);
                continue;
            }
            let v = &obj[f.json.as_str()];
            if v.is_null() {
                continue;
            }
            match (&f.ty, f.repeated) {
                (Ty::MapString | Ty::MapBytes | Ty::MapMessage(_), _) => {
                    let Some(map) = v.as_object() else { continue };
                    for (k, item) in map {
                        let mut entry = Vec::new();
                        put_bytes(&mut entry, 1, k.as_bytes());
                        match &f.ty {
                            Ty::MapString => put_bytes(&mut entry, 2, str_of(item).as_bytes()),
                            Ty::MapBytes => put_bytes(&mut entry, 2, &unbase64(item)),
                            Ty::MapMessage(m) => {
                                let b = self.encode_special(m, item, depth);
                                put_bytes(&mut entry, 2, &b);
                            }
                            _ => {}
                        }
                        put_bytes(out, f.tag, &entry);
                    }
                }
                (_, true) => {
                    let items: &[Value] = match v {
                        Value::Array(a) => a,
                        other => std::slice::from_ref(other),
                    };
                    for item in items.iter().filter(|i| !i.is_null()) {
                        self.encode_one(f, item, out, depth);
                    }
                }
                (_, false) => self.encode_one(f, v, out, depth),
            }
        }
    }

    fn encode_one(&self, f: &Field, v: &Value, out: &mut Vec<u8>, depth: usize) {
        match &f.ty {
            Ty::String => put_bytes(out, f.tag, str_of(v).as_bytes()),
            Ty::Bytes => put_bytes(out, f.tag, &unbase64(v)),
            Ty::Int32 | Ty::Int64 => {
                let Some(n) = v.as_i64().or_else(|| v.as_f64().map(|f| f as i64)) else {
                    return;
                };
                let n = if matches!(f.ty, Ty::Int32) {
                    n as i32 as i64
                } else {
                    n
                };
                encode_key(f.tag, WireType::Varint, out);
                encode_varint(n as u64, out);
            }
            Ty::Bool => {
                let Some(b) = v.as_bool() else { return };
                encode_key(f.tag, WireType::Varint, out);
                encode_varint(b as u64, out);
            }
            Ty::Double => {
                let Some(d) = v.as_f64() else { return };
                encode_key(f.tag, WireType::SixtyFourBit, out);
                out.extend_from_slice(&d.to_le_bytes());
            }
            Ty::Message(m) => {
                let b = self.encode_special(m, v, depth);
                put_bytes(out, f.tag, &b);
            }
            Ty::Inline(_) | Ty::MapString | Ty::MapBytes | Ty::MapMessage(_) => {}
        }
    }

    fn encode_special(&self, msg: &str, v: &Value, depth: usize) -> Vec<u8> {
        let mut out = Vec::new();
        match msg {
            TIME | MICRO_TIME => {
                if let Some(ts) = v.as_str().and_then(|s| s.parse::<jiff::Timestamp>().ok()) {
                    encode_key(1, WireType::Varint, &mut out);
                    encode_varint(ts.as_second() as u64, &mut out);
                    if msg == MICRO_TIME || ts.subsec_nanosecond() != 0 {
                        encode_key(2, WireType::Varint, &mut out);
                        encode_varint(ts.subsec_nanosecond() as i64 as u64, &mut out);
                    }
                }
            }
            DURATION => {
                let nanos = v.as_str().and_then(parse_go_duration).unwrap_or(0);
                encode_key(1, WireType::Varint, &mut out);
                encode_varint(nanos as u64, &mut out);
            }
            QUANTITY => put_bytes(&mut out, 1, str_of(v).as_bytes()),
            INT_OR_STRING => match v {
                Value::String(s) => {
                    encode_key(1, WireType::Varint, &mut out);
                    encode_varint(1, &mut out);
                    put_bytes(&mut out, 3, s.as_bytes());
                }
                other => {
                    encode_key(1, WireType::Varint, &mut out);
                    encode_varint(0, &mut out);
                    encode_key(2, WireType::Varint, &mut out);
                    encode_varint(other.as_i64().unwrap_or(0) as i32 as i64 as u64, &mut out);
                }
            },
            RAW_EXTENSION | FIELDS_V1 => {
                put_bytes(&mut out, 1, &serde_json::to_vec(v).unwrap_or_default());
            }
            m if is_string_list(m) => {
                for item in v.as_array().into_iter().flatten() {
                    put_bytes(&mut out, 1, str_of(item).as_bytes());
                }
            }
            m => self.encode_into(m, v, &mut out, depth + 1),
        }
        out
    }
}

impl Schema {
    /// Checks that a built-in object's fields have the JSON types its Go
    /// type has, as the real server's decoder does before anything else;
    /// the error is Go's (`json: cannot unmarshal bool into Go struct field
    /// Container.spec.containers.image of type string`). Kinds without a
    /// schema (custom resources) pass.
    pub fn check_types(&self, api_version: &str, kind: &str, obj: &Value) -> Result<(), String> {
        let Some(msg) = self.message_for(api_version, kind) else {
            return Ok(());
        };
        match obj.as_object() {
            Some(map) => self.check_fields(msg, map, ""),
            None => Ok(()),
        }
    }

    fn check_fields(&self, msg: &str, obj: &Map<String, Value>, path: &str) -> Result<(), String> {
        for (key, value) in obj {
            if value.is_null() {
                continue;
            }
            // Go names the struct being decoded, also for the fields of a
            // struct it embeds.
            if let Some((_, field)) = self.field_by_json(msg, key) {
                let here = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                self.check_value(msg, field, value, &here)?;
            }
        }
        Ok(())
    }

    /// What a field of `msg` holds, for walking an object by its schema:
    /// the short name of the struct that declares it (`Container` for
    /// `ports` of an EphemeralContainer's embedded common fields), and the
    /// message of its value (of each item or map value), if a message.
    pub fn child<'a>(&'a self, msg: &'a str, json: &str) -> Option<(&'a str, Option<&'a str>)> {
        let (owner, field) = self.field_by_json(msg, json)?;
        let short = owner.rsplit('.').next().unwrap_or(owner);
        let value = match &field.ty {
            Ty::Message(m) | Ty::MapMessage(m) => Some(m.as_str()),
            _ => None,
        };
        Some((short, value))
    }

    /// The field named `json` in `msg` or in a struct it embeds inline,
    /// with the message that declares it.
    fn field_by_json<'a>(&'a self, msg: &'a str, json: &str) -> Option<(&'a str, &'a Field)> {
        let fields = self.messages.get(msg)?;
        if let Some(f) = fields.iter().find(|f| f.json == json) {
            return Some((msg, f));
        }
        fields.iter().find_map(|f| match &f.ty {
            Ty::Inline(m) => self.field_by_json(m, json),
            _ => None,
        })
    }

    fn check_value(&self, owner: &str, f: &Field, v: &Value, path: &str) -> Result<(), String> {
        let fail = |found: &Value, want: String| {
            let struct_name = owner.rsplit('.').next().unwrap_or(owner);
            Err(format!(
                "json: cannot unmarshal {} into Go struct field {struct_name}.{path} of type {want}",
                json_kind(found)
            ))
        };
        let go = |ty: &Ty| match ty {
            Ty::String => "string".to_owned(),
            Ty::Int32 => "int32".to_owned(),
            Ty::Int64 => "int64".to_owned(),
            Ty::Bool => "bool".to_owned(),
            Ty::Double => "float64".to_owned(),
            Ty::Bytes => "[]uint8".to_owned(),
            Ty::MapString => "map[string]string".to_owned(),
            Ty::MapBytes => "map[string][]uint8".to_owned(),
            Ty::Message(m) | Ty::Inline(m) | Ty::MapMessage(m) => {
                let mut parts = m.rsplit('.');
                let name = parts.next().unwrap_or_default();
                let pkg = parts.next().unwrap_or_default();
                format!("{pkg}.{name}")
            }
        };
        if f.repeated && !matches!(f.ty, Ty::MapString | Ty::MapBytes | Ty::MapMessage(_)) {
            let Some(items) = v.as_array() else {
                return fail(v, format!("[]{}", go(&f.ty)));
            };
            let one = Field {
                repeated: false,
                ..f.clone()
            };
            return items
                .iter()
                .filter(|i| !i.is_null())
                .try_for_each(|i| self.check_value(owner, &one, i, path));
        }
        let ok = match &f.ty {
            Ty::String | Ty::Bytes => v.is_string(),
            Ty::Int32 | Ty::Int64 => v.is_i64() || v.is_u64(),
            Ty::Bool => v.is_boolean(),
            Ty::Double => v.is_number(),
            Ty::Inline(_) => true,
            Ty::MapString | Ty::MapBytes => v
                .as_object()
                .is_some_and(|m| m.values().all(|x| x.is_string() || x.is_null())),
            Ty::MapMessage(m) => {
                let Some(map) = v.as_object() else {
                    return fail(v, format!("map[string]{}", go(&f.ty)));
                };
                let one = Field {
                    ty: Ty::Message(m.clone()),
                    ..f.clone()
                };
                return map
                    .values()
                    .filter(|x| !x.is_null())
                    .try_for_each(|x| self.check_value(owner, &one, x, path));
            }
            Ty::Message(m) => match m.as_str() {
                TIME | MICRO_TIME | DURATION => v.is_string(),
                QUANTITY | INT_OR_STRING => v.is_string() || v.is_number(),
                RAW_EXTENSION | FIELDS_V1 => true,
                m if is_string_list(m) => v
                    .as_array()
                    .is_some_and(|a| a.iter().all(|x| x.is_string())),
                m => {
                    return match v.as_object() {
                        Some(map) => self.check_fields(m, map, path),
                        None => fail(v, go(&f.ty)),
                    };
                }
            },
        };
        if ok { Ok(()) } else { fail(v, go(&f.ty)) }
    }
}

/// How Go's JSON decoder names a value's type in its errors.
fn json_kind(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(_) => "bool".into(),
        Value::Number(n) if n.is_f64() => format!("number {n}"),
        Value::Number(_) => "number".into(),
        Value::String(_) => "string".into(),
        Value::Array(_) => "array".into(),
        Value::Object(_) => "object".into(),
    }
}

/// Messages that are a list of strings in JSON.
fn is_string_list(msg: &str) -> bool {
    msg.ends_with(".ExtraValue") || msg == "apimachinery.pkg.apis.meta.v1.Verbs"
}

fn str_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn unbase64(v: &Value) -> Vec<u8> {
    v.as_str()
        .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
        .unwrap_or_default()
}

fn put_bytes(out: &mut Vec<u8>, tag: u32, b: &[u8]) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(b.len() as u64, out);
    out.extend_from_slice(b);
}

fn push(out: &mut Map<String, Value>, key: &str, v: Value, repeated: bool) {
    if repeated {
        match out
            .entry(key.to_owned())
            .or_insert_with(|| Value::Array(Vec::new()))
        {
            Value::Array(a) => a.push(v),
            other => *other = Value::Array(vec![v]),
        }
    } else {
        out.insert(key.to_owned(), v);
    }
}

fn take_bytes<'a>(buf: &mut &'a [u8]) -> Result<&'a [u8], ProtoError> {
    let len = decode_varint(buf)?;
    let len = usize::try_from(len).map_err(|_| ProtoError::Wire("length overflow".into()))?;
    if len > buf.len() {
        return Err(ProtoError::Wire(
            "length past the end of the message".into(),
        ));
    }
    let (head, tail) = buf.split_at(len);
    *buf = tail;
    Ok(head)
}

fn scalar_wire(ty: &Ty) -> WireType {
    match ty {
        Ty::Double => WireType::SixtyFourBit,
        _ => WireType::Varint,
    }
}

fn scalar(ty: &Ty, buf: &mut &[u8], wire: WireType) -> Result<Value, ProtoError> {
    Ok(match (ty, wire) {
        (Ty::Double, WireType::SixtyFourBit) => {
            if buf.len() < 8 {
                return Err(ProtoError::Wire("truncated double".into()));
            }
            json!(buf.get_f64_le())
        }
        (Ty::Int32, WireType::Varint) => json!(decode_varint(buf)? as i64 as i32),
        (Ty::Int64, WireType::Varint) => json!(decode_varint(buf)? as i64),
        (Ty::Bool, WireType::Varint) => json!(decode_varint(buf)? != 0),
        (_, w) => return Err(ProtoError::Wire(format!("unexpected wire type {w:?}"))),
    })
}

fn skip(buf: &mut &[u8], wire: WireType) -> Result<(), ProtoError> {
    match wire {
        WireType::Varint => {
            decode_varint(buf)?;
        }
        WireType::SixtyFourBit | WireType::ThirtyTwoBit => {
            let n = if wire == WireType::SixtyFourBit { 8 } else { 4 };
            if buf.len() < n {
                return Err(ProtoError::Wire("truncated fixed field".into()));
            }
            buf.advance(n);
        }
        WireType::LengthDelimited => {
            take_bytes(buf)?;
        }
        WireType::StartGroup | WireType::EndGroup => {
            return Err(ProtoError::Wire("groups are not used by Kubernetes".into()));
        }
    }
    Ok(())
}

/// `k8s\0` + runtime.Unknown -> (apiVersion, kind, raw).
fn unwrap_unknown(body: &[u8]) -> Result<(String, String, Vec<u8>), ProtoError> {
    let mut buf = body.strip_prefix(MAGIC).ok_or(ProtoError::NoPrefix)?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), Vec::new());
    while buf.has_remaining() {
        let (tag, wire) = decode_key(&mut buf)?;
        match tag {
            1 => {
                let mut tm = take_bytes(&mut buf)?;
                while tm.has_remaining() {
                    let (t, w) = decode_key(&mut tm)?;
                    match t {
                        1 => api_version = String::from_utf8_lossy(take_bytes(&mut tm)?).into(),
                        2 => kind = String::from_utf8_lossy(take_bytes(&mut tm)?).into(),
                        _ => skip(&mut tm, w)?,
                    }
                }
            }
            2 => raw = take_bytes(&mut buf)?.to_vec(),
            _ => skip(&mut buf, wire)?,
        }
    }
    if kind.is_empty() {
        return Err(ProtoError::NoKind);
    }
    Ok((api_version, kind, raw))
}

fn wrap_unknown(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let mut type_meta = Vec::new();
    put_bytes(&mut type_meta, 1, api_version.as_bytes());
    put_bytes(&mut type_meta, 2, kind.as_bytes());
    let mut out = MAGIC.to_vec();
    put_bytes(&mut out, 1, &type_meta);
    put_bytes(&mut out, 2, raw);
    put_bytes(&mut out, 3, b"");
    put_bytes(&mut out, 4, b"");
    out
}

/// Go's `time.Duration.String()` for whole units: `1h2m3s`, `1.5s`, `0s`.
fn go_duration(nanos: i64) -> String {
    if nanos == 0 {
        return "0s".into();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let n = nanos.unsigned_abs();
    if n < 1_000_000_000 {
        return match n {
            n if n < 1_000 => format!("{sign}{n}ns"),
            n if n < 1_000_000 => format!("{sign}{}µs", trim(n as f64 / 1e3)),
            n => format!("{sign}{}ms", trim(n as f64 / 1e6)),
        };
    }
    let (h, rest) = (n / 3_600_000_000_000, n % 3_600_000_000_000);
    let (m, rest) = (rest / 60_000_000_000, rest % 60_000_000_000);
    let s = trim(rest as f64 / 1e9);
    match (h, m) {
        (0, 0) => format!("{sign}{s}s"),
        (0, m) => format!("{sign}{m}m{s}s"),
        (h, m) => format!("{sign}{h}h{m}m{s}s"),
    }
}

fn trim(f: f64) -> String {
    let s = format!("{f:.9}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// Parses Go duration text (`1h30m`, `1.5s`, `300ms`) to nanoseconds.
fn parse_go_duration(s: &str) -> Option<i64> {
    let (neg, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s),
    };
    if rest == "0" {
        return Some(0);
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let n: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        total += n * unit;
        rest = &rest[unit_end..];
    }
    let total = total as i64;
    Some(if neg { -total } else { total })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_and_write_as_go_does() {
        for (text, nanos) in [
            ("0s", 0),
            ("1.5s", 1_500_000_000),
            ("1m0s", 60_000_000_000),
            ("1h2m3s", 3_723_000_000_000),
            ("300ms", 300_000_000),
        ] {
            assert_eq!(go_duration(nanos), text);
            assert_eq!(parse_go_duration(text), Some(nanos), "{text}");
        }
        assert_eq!(parse_go_duration("1x"), None);
    }

    #[test]
    fn every_field_type_resolves_to_a_message() {
        let s = Schema::builtin();
        assert!(s.messages.len() > 400, "{}", s.messages.len());
        for (msg, fields) in &s.messages {
            for f in fields {
                if let Ty::Message(t) | Ty::Inline(t) | Ty::MapMessage(t) = &f.ty {
                    assert!(s.messages.contains_key(t), "{msg}.{} -> {t}", f.json);
                }
            }
        }
        assert_eq!(s.message_for("v1", "Pod"), Some("api.core.v1.Pod"));
        assert_eq!(s.message_for("v1", "PodList"), Some("api.core.v1.PodList"));
        assert_eq!(
            s.message_for("meta.k8s.io/v1", "DeleteOptions"),
            Some("apimachinery.pkg.apis.meta.v1.DeleteOptions")
        );
        assert_eq!(
            s.message_for("v1", "Status"),
            Some("apimachinery.pkg.apis.meta.v1.Status")
        );
        assert_eq!(
            s.message_for("policy/v1", "Eviction"),
            Some("api.policy.v1.Eviction")
        );
        assert_eq!(
            s.message_for("nodemaintenance.medik8s.io/v1beta1", "NodeMaintenance"),
            None
        );
    }

    #[test]
    fn wrong_json_types_get_gos_error() {
        let s = Schema::builtin();
        let pod = |spec: Value| json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec});
        assert_eq!(
            s.check_types("v1", "Pod", &pod(json!({"containers": [{"name": "a", "image": true}]}))),
            Err("json: cannot unmarshal bool into Go struct field Container.spec.containers.image of type string".into())
        );
        assert_eq!(
            s.check_types("v1", "Pod", &pod(json!({"containers": {"name": "a"}}))),
            Err("json: cannot unmarshal object into Go struct field PodSpec.spec.containers of type []v1.Container".into())
        );
        assert_eq!(
            s.check_types("v1", "Pod", &pod(json!({"terminationGracePeriodSeconds": 1.5}))),
            Err("json: cannot unmarshal number 1.5 into Go struct field PodSpec.spec.terminationGracePeriodSeconds of type int64".into())
        );
        // Inline structs, special types and nulls are fine.
        let good = pod(json!({
            "containers": [{"name": "a", "image": "x", "resources": {"limits": {"cpu": 1, "memory": "1Gi"}},
                            "ports": [{"containerPort": 80}],
                            "readinessProbe": {"httpGet": {"port": "http"}}}],
            "volumes": [{"name": "v", "emptyDir": {}}],
            "nodeName": null,
        }));
        assert_eq!(s.check_types("v1", "Pod", &good), Ok(()));
        assert_eq!(
            s.check_types("v1", "Pod", &pod(json!({"volumes": [{"name": "v", "emptyDir": "yes"}]}))),
            Err("json: cannot unmarshal string into Go struct field Volume.spec.volumes.emptyDir of type v1.EmptyDirVolumeSource".into())
        );
        assert_eq!(
            s.check_types("v1", "ConfigMap", &json!({"data": {"a": 1}}))
                .map_err(|e| e.contains("map[string]string")),
            Err(true)
        );
        assert_eq!(
            s.check_types("example.com/v1", "Thing", &json!({"spec": 1})),
            Ok(())
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let s = Schema::builtin();
        for body in [
            &b""[..],
            b"k8s",
            b"k8s\0",
            b"k8s\0\x0a\xff\xff\xff\xff\x0f",
            b"k8s\0\x0a\x04\x0a\x02v1",
            b"{\"kind\":\"Pod\"}",
            b"k8s\0\x0b",
        ] {
            assert!(s.decode_object(body).is_err(), "{body:?}");
        }
        // A Pod whose metadata length runs past the end.
        let mut body = wrap_unknown("v1", "Pod", &[0x0a, 0x7f, 0x01]);
        assert!(s.decode_object(&body).is_err());
        body.truncate(body.len() - 1);
        assert!(s.decode_object(&body).is_err());
    }
}
