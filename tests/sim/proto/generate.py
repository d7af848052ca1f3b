#!/usr/bin/env python3
"""Writes tests/sim/src/proto/schema.txt: the protobuf layout of the built-in
Kubernetes kinds nmo-sim serves, read from the k8s-pb crate (field numbers,
wire types, message types) and the k8s-openapi crate (the JSON name of each
field, e.g. `podIP` where k8s-pb says `pod_ip`).

Run from the repository root after changing either crate's version:

    python3 tests/sim/proto/generate.py

It finds both crates with `cargo metadata`. The output is committed; the
sim's tests check it against k8s-pb's own encoder (tests/sim/tests/protobuf.rs).
"""
import json, os, re, subprocess, sys

# The modules whose messages the simulator can carry, and everything they
# reference.
ROOTS = [
    "api/core/v1", "api/apps/v1", "api/batch/v1", "api/coordination/v1",
    "api/events/v1", "api/policy/v1", "api/rbac/v1", "api/authentication/v1",
    "api/authorization/v1", "api/autoscaling/v1", "api/admissionregistration/v1",
    "apimachinery/pkg/apis/meta/v1", "apimachinery/pkg/runtime",
]
OPENAPI_FEATURE = "v1_37"


def crate_dirs():
    meta = json.loads(subprocess.check_output(
        ["cargo", "metadata", "--format-version", "1", "--locked"]))
    dirs = {}
    for p in meta["packages"]:
        if p["name"] in ("k8s-pb", "k8s-openapi"):
            dirs[p["name"]] = os.path.join(os.path.dirname(p["manifest_path"]), "src")
    return dirs["k8s-pb"], os.path.join(dirs["k8s-openapi"], OPENAPI_FEATURE)


ATTR = re.compile(r'#\[prost\((\w+)(?: = "([^"]*)")?,\s*(?:(optional|repeated|required),\s*)?(?:boxed,\s*)?(?:packed = "\w+",\s*)?tag = "(\d+)"\)\]')


def resolve(module, path):
    """`super::super::x::Y` seen from `module` (a list) -> dotted name."""
    parts = path.split("::")
    mod = list(module)
    while parts and parts[0] == "super":
        parts.pop(0)
        mod.pop()
    return ".".join(mod + parts)


def inner_type(ty):
    ty = re.sub(r"\s+", "", ty)
    for wrapper in ("::core::option::Option<", "::prost::alloc::boxed::Box<", "::prost::alloc::vec::Vec<"):
        if ty.startswith(wrapper):
            ty = ty[len(wrapper):-1].rstrip(",")
    if "BTreeMap<" in ty:
        ty = ty[ty.index("<") + 1:-1].rstrip(",")
        ty = ty.split(",", 1)[1]
    return ty


def parse_pb(src, module):
    text = open(os.path.join(src, *module, "mod.rs")).read()
    messages, resources = {}, []
    lines = text.split("\n")
    i = 0
    current = None
    while i < len(lines):
        line = lines[i].strip()
        m = re.match(r"pub struct (\w+) \{(\})?", line)
        if m:
            current = ".".join(module + [m.group(1)])
            messages[current] = []
            if m.group(2):
                current = None
        elif line == "}" and current:
            current = None
        elif current and line.startswith("#[prost("):
            a = ATTR.match(line)
            if not a:
                sys.exit(f"unparsed attribute in {current}: {line}")
            kind, arg, label, tag = a.groups()
            # the field: `pub name: Type,` possibly over several lines
            j = i + 1
            decl = lines[j].strip()
            while not decl.endswith(",") or decl.count("<") != decl.count(">"):
                j += 1
                decl = decl + lines[j].strip()
            i = j
            fm = re.match(r"pub (?:r#)?(\w+):\s*(.*),$", decl)
            if not fm:
                sys.exit(f"unparsed field in {current}: {decl}")
            name, ty = fm.group(1), fm.group(2)
            if kind == "btree_map":
                key, value = [s.strip() for s in arg.split(",")]
                assert key == "string", (current, name)
                kind_out = "map:" + value
                target = resolve(module, inner_type(ty)) if value == "message" else ""
            elif kind == "message":
                kind_out = "message"
                target = resolve(module, inner_type(ty))
            else:
                kind_out = kind
                target = ""
            if label == "repeated":
                kind_out += "*"
            messages[current].append((int(tag), name, kind_out, target))
        m = re.match(r"impl crate::Resource for (\w+) \{", line)
        if m:
            block = "\n".join(lines[i:i + 8])
            av = re.search(r'API_VERSION: &\'static str = "([^"]*)"', block).group(1)
            kind = re.search(r'KIND: &\'static str = "([^"]*)"', block).group(1)
            resources.append((av, kind, ".".join(module + [m.group(1)])))
        i += 1
    return messages, resources


def json_names(openapi, module):
    """lowercased struct name -> {rust field: json name} from k8s-openapi."""
    out = {}
    d = os.path.join(openapi, *module)
    if not os.path.isdir(d):
        return out
    for f in os.listdir(d):
        if not f.endswith(".rs"):
            continue
        text = open(os.path.join(d, f)).read()
        for s in re.finditer(r"pub struct (\w+) \{", text):
            optional = dict(re.findall(r"^    pub (?:r#)?(\w+): (Option<)?", text, re.M))
            names = dict((norm(js), (js, rust in optional and not optional[rust]))
                         for js, rust in re.findall(r'"([^"]+)" => Field::Key_(\w+),', text))
            out.setdefault(s.group(1).lower(), {}).update(names)
    return out


def norm(name):
    """`pod_cid_rs`, `podCIDRs` -> `podcidrs`: how the two crates' names meet."""
    return name.replace("_", "").lower()


def camel(snake):
    head, *rest = snake.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def inlined(messages, target, parent_names):
    """An embedded struct (`json:",inline"`): its fields, or those of its own
    embedded structs, appear in the parent's JSON."""
    fields = messages.get(target, [])
    hits = sum(1 for _, name, kind, t in fields
               if norm(name) in parent_names or (kind == "message" and inlined(messages, t, parent_names)))
    return bool(fields) and hits * 2 >= len(fields)


def lookup(names, msg):
    module, struct = msg.rsplit(".", 1)
    return names.get(f"{module}.{struct.lower()}")


def main():
    pb, openapi = crate_dirs()
    messages, resources, names = {}, [], {}
    todo = [r.split("/") for r in ROOTS]
    seen = set()
    while todo:
        module = todo.pop()
        key = "/".join(module)
        if key in seen:
            continue
        seen.add(key)
        msgs, res = parse_pb(pb, module)
        messages.update(msgs)
        resources += res
        for s, found in json_names(openapi, module).items():
            names[".".join(module + [s])] = found
        for fields in msgs.values():
            for _, _, _, target in fields:
                if target:
                    todo.append(target.split(".")[:-1])
    # k8s-openapi flattens embedded structs into their parent: an embedded
    # struct's JSON names are its parent's.
    inline_into = {}
    changed = True
    while changed:
        changed = False
        for msg, fields in messages.items():
            known = lookup(names, msg)
            if not known:
                continue
            for tag, name, kind, target in fields:
                if kind == "message" and norm(name) not in known and (msg, tag) not in inline_into \
                        and inlined(messages, target, known):
                    inline_into[(msg, tag)] = target
                    module, struct = target.rsplit(".", 1)
                    merged = dict(known)
                    merged.update(names.get(f"{module}.{struct.lower()}", {}))
                    names[f"{module}.{struct.lower()}"] = merged
                    changed = True
    out = ["# Generated by tests/sim/proto/generate.py from k8s-pb and k8s-openapi: do not edit.",
           "# R apiVersion kind message | M message | tag json-name type [message]"]
    for av, kind, msg in sorted(resources):
        out.append(f"R {av} {kind} {msg}")
    for msg in sorted(messages):
        out.append(f"M {msg}")
        module, struct = msg.rsplit(".", 1)
        known = lookup(names, msg)
        for tag, name, kind, target in sorted(messages[msg]):
            js, required = (known or {}).get(norm(name), (None, False))
            if (msg, tag) in inline_into:
                js, kind = "-", "inline"
            elif required and not kind.endswith("*"):
                # Go writes it even when zero (no `omitempty`).
                kind += "!"
            out.append(f"{tag} {js or camel(name)} {kind} {target}".rstrip())
    path = os.path.join(os.path.dirname(__file__), "..", "src", "proto", "schema.txt")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"{path}: {len(messages)} messages, {len(resources)} resources")


if __name__ == "__main__":
    main()
