//! Canonical JSON (RFC 8785 / JCS) and the request fingerprint built on it.
//!
//! The RFC vectors are copied from RFC 8785 itself: the primitive example of
//! §3.2.2 with its output and the UTF-8 bytes of §3.2.4, the sorting example
//! of §3.2.3, and the number samples of Appendix B.

use std::fmt;

use idempotency::Fingerprint;
use idempotency::fingerprint::canonical_json;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const POST: &str = "POST";
const ROUTE: &str = "/v1/projects/{project_id}/tasks";
const ACCOUNT: &str = "0b6f3c8e-5d1a-4f7e-9a2b-3c4d5e6f7a8b";

fn parse(text: &str) -> Value {
    serde_json::from_str(text).expect("the test input is valid JSON")
}

fn canonical_text(value: &Value) -> String {
    String::from_utf8(canonical_json(value)).expect("canonical JSON is UTF-8")
}

/// The member names of a JSON object in the order they are written, which a
/// `serde_json::Value` (a sorted map) would not keep.
struct MemberNames(Vec<String>);

impl<'de> Deserialize<'de> for MemberNames {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Names;

        impl<'de> Visitor<'de> for Names {
            type Value = MemberNames;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<MemberNames, A::Error> {
                let mut names = Vec::new();
                while let Some((name, IgnoredAny)) = map.next_entry::<String, IgnoredAny>()? {
                    names.push(name);
                }
                Ok(MemberNames(names))
            }
        }

        deserializer.deserialize_map(Names)
    }
}

// ---------------------------------------------------------------------------
// RFC 8785 §3.2.2 / §3.2.4: serialization of primitive data types.
// ---------------------------------------------------------------------------

const RFC_PRIMITIVES_INPUT: &str = r#"{
  "numbers": [333333333.33333329, 1E30, 4.50,
              2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}"#;

#[test]
fn the_rfc_primitive_serialization_example_canonicalizes_to_the_rfc_output() {
    let expected = r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#;

    assert_eq!(canonical_text(&parse(RFC_PRIMITIVES_INPUT)), expected);
}

#[test]
fn the_rfc_primitive_serialization_example_produces_the_rfc_utf8_bytes() {
    // RFC 8785 §3.2.4, verbatim.
    let expected: Vec<u8> = "\
        7b 22 6c 69 74 65 72 61 6c 73 22 3a 5b 6e 75 6c 6c 2c 74 72 \
        75 65 2c 66 61 6c 73 65 5d 2c 22 6e 75 6d 62 65 72 73 22 3a \
        5b 33 33 33 33 33 33 33 33 33 2e 33 33 33 33 33 33 33 2c 31 \
        65 2b 33 30 2c 34 2e 35 2c 30 2e 30 30 32 2c 31 65 2d 32 37 \
        5d 2c 22 73 74 72 69 6e 67 22 3a 22 e2 82 ac 24 5c 75 30 30 \
        30 66 5c 6e 41 27 42 5c 22 5c 5c 5c 5c 5c 22 2f 22 7d"
        .split_whitespace()
        .map(|byte| u8::from_str_radix(byte, 16).expect("a hex byte"))
        .collect();

    assert_eq!(canonical_json(&parse(RFC_PRIMITIVES_INPUT)), expected);
}

// ---------------------------------------------------------------------------
// RFC 8785 §3.2.3: sorting of object properties.
// ---------------------------------------------------------------------------

const RFC_SORTING_INPUT: &str = r#"{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}"#;

#[test]
fn object_members_are_sorted_by_utf16_code_units_as_in_the_rfc_sorting_example() {
    let canonical = canonical_text(&parse(RFC_SORTING_INPUT));

    let MemberNames(names) = serde_json::from_str(&canonical).expect("canonical JSON parses back");
    let expected_names = [
        "\r",        // Carriage Return
        "1",         // One
        "\u{80}",    // Control
        "\u{f6}",    // Latin Small Letter O With Diaeresis
        "\u{20ac}",  // Euro Sign
        "\u{1f600}", // Emoji: Grinning Face (UTF-16 D83D DE00)
        "\u{fb33}",  // Hebrew Letter Dalet With Dagesh
    ];
    assert_eq!(names, expected_names);

    // The point of the vector: by code point (Rust's `str` order) the emoji
    // would come last, by UTF-16 code unit it sorts before U+FB33.
    let mut by_code_point = names.clone();
    by_code_point.sort();
    assert_ne!(by_code_point, names);

    let expected = concat!(
        r#"{"\r":"Carriage Return","1":"One","#,
        "\"\u{80}\":\"Control\",",
        "\"\u{f6}\":\"Latin Small Letter O With Diaeresis\",",
        "\"\u{20ac}\":\"Euro Sign\",",
        "\"\u{1f600}\":\"Emoji: Grinning Face\",",
        "\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}",
    );
    assert_eq!(canonical, expected);
}

// ---------------------------------------------------------------------------
// RFC 8785 Appendix B: number serialization samples (IEEE 754 bits → JSON).
// ---------------------------------------------------------------------------

const RFC_NUMBER_SAMPLES: &[(u64, &str)] = &[
    (0x0000_0000_0000_0000, "0"),
    (0x8000_0000_0000_0000, "0"), // minus zero
    (0x0000_0000_0000_0001, "5e-324"),
    (0x8000_0000_0000_0001, "-5e-324"),
    (0x7fef_ffff_ffff_ffff, "1.7976931348623157e+308"),
    (0xffef_ffff_ffff_ffff, "-1.7976931348623157e+308"),
    (0x4340_0000_0000_0000, "9007199254740992"),
    (0xc340_0000_0000_0000, "-9007199254740992"),
    (0x4430_0000_0000_0000, "295147905179352830000"),
    (0x44b5_2d02_c7e1_4af5, "9.999999999999997e+22"),
    (0x44b5_2d02_c7e1_4af6, "1e+23"),
    (0x44b5_2d02_c7e1_4af7, "1.0000000000000001e+23"),
    (0x444b_1ae4_d6e2_ef4e, "999999999999999700000"),
    (0x444b_1ae4_d6e2_ef4f, "999999999999999900000"),
    (0x444b_1ae4_d6e2_ef50, "1e+21"),
    (0x3eb0_c6f7_a0b5_ed8c, "9.999999999999997e-7"),
    (0x3eb0_c6f7_a0b5_ed8d, "0.000001"),
    (0x41b3_de43_5555_5553, "333333333.3333332"),
    (0x41b3_de43_5555_5554, "333333333.33333325"),
    (0x41b3_de43_5555_5555, "333333333.3333333"),
    (0x41b3_de43_5555_5556, "333333333.3333334"),
    (0x41b3_de43_5555_5557, "333333333.33333343"),
    (0xbecb_f647_612f_3696, "-0.0000033333333333333333"),
    (0x4314_3ff3_c1cb_0959, "1424953923781206.2"), // round to even
];

#[test]
fn numbers_serialize_as_in_rfc_appendix_b() {
    for &(bits, expected) in RFC_NUMBER_SAMPLES {
        let number =
            serde_json::Number::from_f64(f64::from_bits(bits)).expect("an Appendix B finite sample is a JSON number");
        assert_eq!(canonical_text(&Value::Number(number)), expected, "IEEE 754 {bits:016x}");
    }
}

#[test]
fn numbers_parsed_from_a_non_canonical_spelling_serialize_as_in_rfc_appendix_b() {
    for &(bits, expected) in RFC_NUMBER_SAMPLES {
        // 17 significant digits in exponent form: exact, but never the
        // canonical spelling, so the parse and the reformatting both count.
        let spelled = format!("{:.16e}", f64::from_bits(bits));
        let value = parse(&format!("[{spelled}]"));
        assert_eq!(
            canonical_text(&value),
            format!("[{expected}]"),
            "IEEE 754 {bits:016x} spelled {spelled}"
        );
    }
}

#[test]
fn non_finite_numbers_never_reach_canonical_json_as_rfc_appendix_b_requires() {
    // Appendix B: 7fffffffffffffff (NaN) and 7ff0000000000000 (Infinity)
    // must cause an error. `canonical_json` takes a `Value`, which cannot
    // hold them, and a body that spells one is not JSON.
    for bits in [0x7fff_ffff_ffff_ffff_u64, 0x7ff0_0000_0000_0000, 0xfff0_0000_0000_0000] {
        assert!(
            serde_json::Number::from_f64(f64::from_bits(bits)).is_none(),
            "{bits:016x} is a number"
        );
    }
    for spelled in ["NaN", "Infinity", "-Infinity", "1e400"] {
        assert!(serde_json::from_str::<Value>(spelled).is_err(), "{spelled} parsed");
    }
}

// ---------------------------------------------------------------------------
// The reference implementation: serde_json_canonicalizer.
// ---------------------------------------------------------------------------

/// Characters where canonical JSON is easy to get wrong: escapes, controls,
/// the solidus, and names whose UTF-16 order is not their code point order.
const TRICKY: &[char] = &[
    'a',
    'B',
    '1',
    ' ',
    '"',
    '\\',
    '/',
    '\u{0}',
    '\u{8}',
    '\t',
    '\n',
    '\u{b}',
    '\u{c}',
    '\r',
    '\u{1f}',
    '\u{7f}',
    '\u{80}',
    '\u{f6}',
    '\u{2028}',
    '\u{20ac}',
    '\u{e000}',
    '\u{fb33}',
    '\u{ffff}',
    '\u{10000}',
    '\u{1f600}',
    '\u{10ffff}',
];

fn random_text(rng: &mut fastrand::Rng) -> String {
    (0..rng.usize(0..6))
        .map(|_| TRICKY[rng.usize(..TRICKY.len())])
        .collect()
}

fn random_number(rng: &mut fastrand::Rng) -> Value {
    match rng.u8(0..4) {
        0 => json!(rng.i64(-1000..1000)),
        1 => json!(rng.i64(..)),
        2 => json!(rng.u64(..)),
        _ => loop {
            // any finite double, its bits drawn at random
            if let Some(number) = serde_json::Number::from_f64(f64::from_bits(rng.u64(..))) {
                break Value::Number(number);
            }
        },
    }
}

fn random_value(rng: &mut fastrand::Rng, depth: u32) -> Value {
    match rng.u8(0..if depth == 0 { 4 } else { 6 }) {
        0 => [Value::Null, json!(true), json!(false)][rng.usize(..3)].clone(),
        1 => random_number(rng),
        2 | 3 => Value::String(random_text(rng)),
        4 => Value::Array((0..rng.usize(0..4)).map(|_| random_value(rng, depth - 1)).collect()),
        _ => Value::Object(
            (0..rng.usize(0..6))
                .map(|_| (random_text(rng), random_value(rng, depth - 1)))
                .collect(),
        ),
    }
}

#[test]
fn canonical_json_is_byte_for_byte_what_the_reference_implementation_writes() {
    let mut rng = fastrand::Rng::with_seed(8785);
    for _ in 0..20_000 {
        let value = random_value(&mut rng, 3);
        let reference = serde_json_canonicalizer::to_vec(&value).expect("the reference writes any value");
        assert_eq!(canonical_json(&value), reference, "{value}");
    }
}

// ---------------------------------------------------------------------------
// The fingerprint.
// ---------------------------------------------------------------------------

fn fingerprint(command: &Value) -> Fingerprint {
    Fingerprint::of(POST, ROUTE, ACCOUNT, command).unwrap()
}

fn a_command() -> Value {
    json!({"project": "apollo", "title": "Write the launch plan", "priority": "high"})
}

#[test]
fn member_order_and_white_space_do_not_change_the_fingerprint() {
    let compact = parse(
        r#"{"project":"apollo","title":"Write the launch plan","labels":["a","b"],"due":{"date":"2025-07-01","zone":"UTC"},"estimate":1.50}"#,
    );
    let spaced = parse(
        "{\n  \"due\" : { \"zone\" : \"UTC\" ,\t\"date\" : \"2025-07-01\" } ,\r\n  \"estimate\" : 15e-1 ,\n  \"labels\" : [ \"a\" , \"b\" ] ,\n  \"title\" : \"Write the launch plan\" ,\n  \"project\" : \"apollo\"\n}\n",
    );

    assert_eq!(canonical_json(&compact), canonical_json(&spaced));
    assert_eq!(fingerprint(&compact), fingerprint(&spaced));
}

#[test]
fn array_order_changes_the_fingerprint() {
    let ab = json!({"labels": ["a", "b"]});
    let ba = json!({"labels": ["b", "a"]});

    assert_ne!(fingerprint(&ab), fingerprint(&ba));
}

#[test]
fn a_different_command_gives_a_different_fingerprint() {
    let other_title = json!({"project": "apollo", "title": "Write the landing plan", "priority": "high"});
    let extra_member = json!({
        "project": "apollo", "title": "Write the launch plan", "priority": "high", "assignee": null
    });

    assert_ne!(fingerprint(&a_command()), fingerprint(&other_title));
    assert_ne!(fingerprint(&a_command()), fingerprint(&extra_member));
}

#[test]
fn a_different_route_gives_a_different_fingerprint() {
    let command = a_command();

    assert_ne!(
        Fingerprint::of(POST, ROUTE, ACCOUNT, &command).unwrap(),
        Fingerprint::of(POST, "/v1/projects/{project_id}/notes", ACCOUNT, &command).unwrap()
    );
}

#[test]
fn a_different_method_gives_a_different_fingerprint() {
    let command = a_command();

    assert_ne!(
        Fingerprint::of(POST, ROUTE, ACCOUNT, &command).unwrap(),
        Fingerprint::of("PUT", ROUTE, ACCOUNT, &command).unwrap()
    );
}

#[test]
fn a_different_account_gives_a_different_fingerprint() {
    let command = a_command();

    assert_ne!(
        Fingerprint::of(POST, ROUTE, ACCOUNT, &command).unwrap(),
        Fingerprint::of(POST, ROUTE, "7c1e2d3f-4a5b-4c6d-8e9f-0a1b2c3d4e5f", &command).unwrap()
    );
}

#[test]
fn the_fingerprint_is_64_lowercase_hex_characters() {
    let fingerprint = fingerprint(&a_command());
    let digest = fingerprint.as_str();

    assert_eq!(digest.len(), 64, "{digest}");
    assert!(
        digest.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)),
        "{digest}"
    );
    assert_eq!(fingerprint.to_string(), digest);
}

#[test]
fn the_fingerprint_is_the_sha256_of_the_canonical_method_route_account_and_command() {
    let command = a_command();
    let envelope = json!({
        "method": POST, "route": ROUTE, "account_id": ACCOUNT, "command": command
    });
    // by the reference implementation, so fingerprints stored before match
    let reference = serde_json_canonicalizer::to_vec(&envelope).expect("the reference writes any value");
    let expected = hex::encode(Sha256::digest(reference));

    assert_eq!(fingerprint(&command).as_str(), expected);
}

/// The request body as it arrives: `priority` may be left out.
#[derive(Serialize, Deserialize)]
struct CreateTaskRequest {
    project: String,
    title: String,
    priority: Option<String>,
}

/// The validated command, with the default applied; this is what is hashed.
#[derive(Serialize)]
struct CreateTask {
    project: String,
    title: String,
    priority: String,
}

impl From<CreateTaskRequest> for CreateTask {
    fn from(request: CreateTaskRequest) -> Self {
        CreateTask {
            project: request.project,
            title: request.title,
            priority: request.priority.unwrap_or_else(|| "normal".to_owned()),
        }
    }
}

#[test]
fn a_defaulted_command_struct_fingerprints_like_the_json_with_the_default_written_out() {
    let omitted: CreateTaskRequest =
        serde_json::from_str(r#"{"project":"apollo","title":"Write the launch plan"}"#).unwrap();
    let explicit: CreateTaskRequest =
        serde_json::from_str(r#"{"priority":"normal","title":"Write the launch plan","project":"apollo"}"#).unwrap();
    let written_out = json!({"title": "Write the launch plan", "project": "apollo", "priority": "normal"});

    let expected = fingerprint(&written_out);
    assert_eq!(
        Fingerprint::of(POST, ROUTE, ACCOUNT, &CreateTask::from(omitted)).unwrap(),
        expected
    );
    assert_eq!(
        Fingerprint::of(POST, ROUTE, ACCOUNT, &CreateTask::from(explicit)).unwrap(),
        expected
    );

    // Hashing the raw request instead would hash `"priority": null`, so two
    // requests that mean the same thing would not match.
    let raw: CreateTaskRequest =
        serde_json::from_str(r#"{"project":"apollo","title":"Write the launch plan"}"#).unwrap();
    assert_ne!(Fingerprint::of(POST, ROUTE, ACCOUNT, &raw).unwrap(), expected);
}

// ---------------------------------------------------------------------------
// Integers a double cannot hold: canonical JSON would round them, so two
// different commands would share a fingerprint. They have none.
// ---------------------------------------------------------------------------

const MAX_EXACT: i64 = (1 << 53) - 1;

fn refused_field(command: &Value) -> Option<String> {
    Fingerprint::of(POST, ROUTE, ACCOUNT, command)
        .err()
        .map(|inexact| inexact.field)
}

#[test]
fn integers_up_to_two_to_the_53_minus_one_in_magnitude_are_fingerprinted_exactly() {
    for n in [MAX_EXACT, -MAX_EXACT] {
        assert_eq!(refused_field(&json!({"amount_minor": n})), None, "{n}");
    }
    assert_ne!(
        fingerprint(&json!({"amount_minor": MAX_EXACT})),
        fingerprint(&json!({"amount_minor": MAX_EXACT - 1}))
    );
}

#[test]
fn an_integer_of_two_to_the_53_or_more_in_magnitude_has_no_fingerprint() {
    let too_large = [
        json!(MAX_EXACT + 1),
        json!(-(MAX_EXACT + 1)),
        json!(9_223_372_036_854_775_807_i64),
        json!(i64::MIN),
        json!(u64::MAX),
    ];
    for n in too_large {
        assert_eq!(
            refused_field(&json!({"amount_minor": n})),
            Some("amount_minor".into()),
            "{n}"
        );
    }
}

#[test]
fn two_integers_that_would_round_to_one_double_are_refused_rather_than_confused() {
    // 9223372036854775807 and 9223372036854775500 are one double, 2^63.
    let first = json!({"amount_minor": 9_223_372_036_854_775_807_i64});
    let retry = json!({"amount_minor": 9_223_372_036_854_775_500_i64});

    assert!(Fingerprint::of(POST, ROUTE, ACCOUNT, &first).is_err());
    assert!(Fingerprint::of(POST, ROUTE, ACCOUNT, &retry).is_err());
}

#[test]
fn the_refusal_names_the_nested_field_that_holds_the_integer() {
    let nested = json!({"order": "o-1", "amount": {"amount_minor": MAX_EXACT + 1, "currency": "EUR"}});
    let in_an_array = json!({"lines": [{"quantity": 1}, {"quantity": -(MAX_EXACT + 1)}]});

    assert_eq!(refused_field(&nested), Some("amount.amount_minor".into()));
    assert_eq!(refused_field(&in_an_array), Some("lines[1].quantity".into()));
}

#[test]
fn floats_are_doubles_already_and_are_fingerprinted_as_they_are() {
    assert_eq!(refused_field(&json!({"ratio": 1e300, "share": 0.1})), None);
}
