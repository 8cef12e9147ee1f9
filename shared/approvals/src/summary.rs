//! What a human judges before an operation runs ([`ApprovalSummary`], which
//! a route's policy writes), and how each field is shown so that no
//! invisible or reordering character can pass one text off as another.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What a human needs to judge one operation: what it does, to what, what
/// follows from it, and the identifiers to check it by.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApprovalSummary {
    #[schema(example = "create an urgent ticket")]
    pub action: String,
    #[schema(example = "project payments-api")]
    pub target: String,
    #[schema(example = "pages the on-call engineer of the project at once")]
    pub consequences: String,
    /// Named values to check the request by (project, title; amount, payee; digest, environment…).
    pub identifiers: BTreeMap<String, String>,
}

impl ApprovalSummary {
    /// What no longer reads as the approver was shown it, in words, when
    /// `now` — the summary the policy writes for a retry — is not `approved`;
    /// `None` when nothing changed. Values are shown [revealed](Revealed).
    pub(crate) fn changes(approved: &ApprovalSummary, now: Option<&ApprovalSummary>) -> Option<String> {
        let Some(now) = now else {
            return Some("the service's policy no longer asks a human about this request".to_owned());
        };
        if now == approved {
            return None;
        }
        let shown =
            |value: Option<&String>| value.map_or("nothing".to_owned(), |v| format!("`{}`", Revealed::of(v).text));
        let changed: Vec<String> = approved
            .identifiers
            .keys()
            .chain(
                now.identifiers
                    .keys()
                    .filter(|name| !approved.identifiers.contains_key(*name)),
            )
            .filter(|name| approved.identifiers.get(*name) != now.identifiers.get(*name))
            .map(|name| {
                format!(
                    "`{name}` was {} when approved and is {} now",
                    shown(approved.identifiers.get(name)),
                    shown(now.identifiers.get(name))
                )
            })
            .collect();
        Some(if changed.is_empty() {
            "the summary of this request reads otherwise than when it was approved".to_owned()
        } else {
            changed.join("; ")
        })
    }
}

/// A summary field as a human may safely read it: every character that
/// does not show as itself written out as a visible escape (`\u202E`), so
/// that `Acme GmbH \u{202E}liveD` cannot pass for `Acme GmbH Devil`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revealed {
    pub text: String,
    /// Whether anything was escaped: the field deserves a mark.
    pub escaped: bool,
}

impl Revealed {
    pub fn of(text: &str) -> Self {
        let mut revealed = Revealed {
            text: String::with_capacity(text.len()),
            escaped: false,
        };
        for c in text.chars() {
            if is_hidden(c) {
                revealed.escaped = true;
                revealed.text.push_str(&escape_char(c));
            } else {
                revealed.text.push(c);
            }
        }
        revealed
    }
}

/// `\u202E`; beyond the Basic Multilingual Plane `\u{E0041}`, so the digits cannot run into the text.
fn escape_char(c: char) -> String {
    match u32::from(c) {
        code @ 0..=0xFFFF => format!("\\u{code:04X}"),
        code => format!("\\u{{{code:X}}}"),
    }
}

/// Characters that show as nothing, or as something else: controls (Cc),
/// bidirectional controls that reorder what follows them, and zero-width
/// and other invisible characters.
pub fn is_hidden(c: char) -> bool {
    c.is_control()
        || matches!(c,
            // bidirectional: marks, embeddings and overrides, isolates
            '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
            // zero-width and invisible: spaces, joiners, word joiner and invisible operators, BOM
            | '\u{00AD}' | '\u{034F}' | '\u{115F}' | '\u{1160}' | '\u{17B4}' | '\u{17B5}' | '\u{180B}'..='\u{180F}'
            | '\u{200B}'..='\u{200D}' | '\u{2060}'..='\u{2064}' | '\u{206A}'..='\u{206F}' | '\u{3164}'
            | '\u{FEFF}' | '\u{FFA0}' | '\u{FFF9}'..='\u{FFFB}' | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            // line and paragraph separators, and tags, which can smuggle text no one sees
            | '\u{2028}' | '\u{2029}' | '\u{E0000}'..='\u{E007F}')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(replaces: &str) -> ApprovalSummary {
        ApprovalSummary {
            action: "deploy".into(),
            target: "checkout in production".into(),
            consequences: format!("replaces {replaces}"),
            identifiers: [("service", "checkout"), ("replaces", replaces)]
                .into_iter()
                .map(|(name, value)| (name.to_owned(), value.to_owned()))
                .collect(),
        }
    }

    #[test]
    fn a_summary_that_reads_as_approved_has_no_changes() {
        assert_eq!(ApprovalSummary::changes(&summary("none"), Some(&summary("none"))), None);
    }

    #[test]
    fn the_changes_name_each_identifier_that_changed_with_what_it_was_and_is() {
        let changes = ApprovalSummary::changes(&summary("none"), Some(&summary("dep_2")));

        assert_eq!(
            changes.as_deref(),
            Some("`replaces` was `none` when approved and is `dep_2` now")
        );
    }

    #[test]
    fn a_request_the_policy_no_longer_gives_to_a_human_has_changed_too() {
        assert!(ApprovalSummary::changes(&summary("none"), None).is_some());
    }

    #[test]
    fn a_changed_value_is_shown_revealed() {
        let changes = ApprovalSummary::changes(&summary("none"), Some(&summary("dep\u{202E}2"))).unwrap();

        assert!(
            !changes.contains('\u{202E}') && changes.contains(r"\u202E"),
            "{changes}"
        );
    }

    #[test]
    fn plain_text_is_shown_as_it_is_and_unmarked() {
        let shown = Revealed::of("Acme GmbH — Zürich, 1 000 € «ok» 東京 👍");
        assert_eq!(shown.text, "Acme GmbH — Zürich, 1 000 € «ok» 東京 👍");
        assert!(!shown.escaped);
    }

    #[test]
    fn control_characters_are_shown_as_escapes() {
        let shown = Revealed::of("a\u{0}b\tc\nd\re\u{1B}[31mf\u{7F}g\u{85}h\u{9F}");
        assert_eq!(
            shown.text,
            r"a\u0000b\u0009c\u000Ad\u000De\u001B[31mf\u007Fg\u0085h\u009F"
        );
        assert!(shown.escaped);
    }

    #[test]
    fn bidirectional_controls_are_shown_as_escapes() {
        let shown = Revealed::of("Acme GmbH \u{202E}liveD\u{202C}");
        assert_eq!(shown.text, r"Acme GmbH \u202EliveD\u202C");
        assert!(shown.escaped);
        for c in [
            '\u{061C}', '\u{200E}', '\u{200F}', '\u{202A}', '\u{202B}', '\u{202D}', '\u{2066}', '\u{2067}', '\u{2068}',
            '\u{2069}',
        ] {
            assert_eq!(Revealed::of(&c.to_string()).text, format!("\\u{:04X}", u32::from(c)));
        }
    }

    #[test]
    fn zero_width_and_invisible_characters_are_shown_as_escapes() {
        let shown = Revealed::of("pay\u{200B}pal\u{FEFF}");
        assert_eq!(shown.text, r"pay\u200Bpal\uFEFF");
        assert!(shown.escaped);
        for c in [
            '\u{00AD}', '\u{200C}', '\u{200D}', '\u{2060}', '\u{2063}', '\u{3164}', '\u{2028}', '\u{2029}',
        ] {
            assert!(Revealed::of(&c.to_string()).escaped, "U+{:04X}", u32::from(c));
        }
    }

    #[test]
    fn characters_beyond_the_basic_plane_are_escaped_with_braces() {
        // a tag character spells text no one sees
        let shown = Revealed::of("ok\u{E0041}");
        assert_eq!(shown.text, r"ok\u{E0041}");
        assert!(shown.escaped);
    }
}
