//! OpenAPI v3 schemas, per group-version, as the real server publishes them
//! under `/openapi/v3/...`: `kubectl explain` reads them, and so do clients
//! that validate or build objects from them.
//!
//! Built-in kinds get k8s-openapi's schemas (its `schemars` support, named
//! `io.k8s.api.core.v1.Pod` as upstream); a CustomResourceDefinition's
//! kinds get the CRD's own `openAPIV3Schema`, with `apiVersion`, `kind` and
//! `metadata` added as the real server adds them. Every kind's schema
//! carries `x-kubernetes-group-version-kind`.

use k8s_openapi::api::{
    admissionregistration, apps, authentication, authorization, batch, coordination, core, events,
    policy, rbac,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::JsonSchema;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde_json::{Map, Value, json};

use crate::resources::ResourceType;

/// Collects the schemas of one group-version (schemars' OpenAPI 3 settings
/// write a `$ref` with siblings as `allOf`, as the real server does).
struct Collector {
    generator: SchemaGenerator,
    group: String,
    version: String,
    /// (component name, kind) of the kinds added.
    kinds: Vec<(String, String)>,
}

impl Collector {
    fn add<T: JsonSchema + k8s_openapi::Resource>(&mut self) {
        if T::GROUP == self.group && T::VERSION == self.version {
            self.generator.subschema_for::<T>();
            self.kinds
                .push((T::schema_name().into_owned(), T::KIND.to_owned()));
        }
    }
}

fn settings() -> SchemaSettings {
    SchemaSettings::openapi3()
}

/// The component name of an object's schema, as the real server names a
/// custom resource's: the group reversed, version, kind.
fn crd_component(t: &ResourceType) -> String {
    let reversed: Vec<&str> = t.group.split('.').rev().collect();
    format!("{}.{}.{}", reversed.join("."), t.version, t.kind)
}

/// `components.schemas` of a group-version's document.
pub fn components(group: &str, version: &str, types: &[ResourceType]) -> Map<String, Value> {
    let mut c = Collector {
        generator: settings().into_generator(),
        group: group.into(),
        version: version.into(),
        kinds: Vec::new(),
    };
    c.add::<core::v1::Namespace>();
    c.add::<core::v1::Node>();
    c.add::<core::v1::Pod>();
    c.add::<core::v1::Event>();
    c.add::<core::v1::ServiceAccount>();
    c.add::<core::v1::ConfigMap>();
    c.add::<core::v1::Secret>();
    c.add::<core::v1::Service>();
    c.add::<core::v1::Endpoints>();
    c.add::<events::v1::Event>();
    c.add::<coordination::v1::Lease>();
    c.add::<policy::v1::PodDisruptionBudget>();
    c.add::<apps::v1::Deployment>();
    c.add::<apps::v1::ReplicaSet>();
    c.add::<apps::v1::StatefulSet>();
    c.add::<apps::v1::DaemonSet>();
    c.add::<batch::v1::Job>();
    c.add::<authentication::v1::TokenReview>();
    c.add::<authentication::v1::SelfSubjectReview>();
    c.add::<authorization::v1::SubjectAccessReview>();
    c.add::<authorization::v1::SelfSubjectAccessReview>();
    c.add::<rbac::v1::Role>();
    c.add::<rbac::v1::RoleBinding>();
    c.add::<rbac::v1::ClusterRole>();
    c.add::<rbac::v1::ClusterRoleBinding>();
    c.add::<apiextensions::v1::CustomResourceDefinition>();
    c.add::<admissionregistration::v1::ValidatingWebhookConfiguration>();
    let crds: Vec<&ResourceType> = types
        .iter()
        .filter(|t| t.group == group && t.version == version && t.schema.is_some())
        .collect();
    if !crds.is_empty() {
        c.generator.subschema_for::<ObjectMeta>();
    }
    let mut defs = c.generator.take_definitions(true);
    for (name, kind) in &c.kinds {
        if let Some(Value::Object(schema)) = defs.get_mut(name) {
            schema.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([{"group": group, "version": version, "kind": kind}]),
            );
        }
    }
    for t in crds {
        defs.insert(crd_component(t), crd_schema(t));
    }
    defs
}

/// A custom resource's schema: the CRD's, with the fields every object has.
fn crd_schema(t: &ResourceType) -> Value {
    let mut schema = t
        .schema
        .clone()
        .unwrap_or_else(|| json!({"type": "object"}));
    if !schema.is_object() {
        schema = json!({"type": "object"});
    }
    let meta_ref = format!(
        "#{}/{}",
        settings().definitions_path,
        ObjectMeta::schema_name()
    );
    let props = schema
        .as_object_mut()
        .map(|o| o.entry("properties").or_insert_with(|| json!({})));
    if let Some(Value::Object(props)) = props {
        props.insert(
            "apiVersion".into(),
            json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."}),
        );
        props.insert(
            "kind".into(),
            json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."}),
        );
        props.insert(
            "metadata".into(),
            json!({"allOf": [{"$ref": meta_ref}], "description": "Standard object's metadata."}),
        );
    }
    if let Some(o) = schema.as_object_mut() {
        o.insert(
            "x-kubernetes-group-version-kind".into(),
            json!([{"group": t.group, "version": t.version, "kind": t.kind}]),
        );
    }
    schema
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_schema_references_its_parts_and_names_its_kind() {
        let c = components("", "v1", &[]);
        let pod = &c["io.k8s.api.core.v1.Pod"];
        assert_eq!(
            pod["x-kubernetes-group-version-kind"],
            json!([{"group": "", "version": "v1", "kind": "Pod"}])
        );
        assert_eq!(
            pod["properties"]["spec"]["allOf"][0]["$ref"],
            "#/components/schemas/io.k8s.api.core.v1.PodSpec"
        );
        assert!(c.contains_key("io.k8s.api.core.v1.PodSpec"));
        assert!(c.contains_key("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"));
        assert!(!c.contains_key("io.k8s.api.apps.v1.Deployment"));
    }
}
