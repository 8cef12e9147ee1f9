//! Ids put into another system's URLs (a rollout at the controller, an
//! operation at a service): data, never paths. Each is one path segment,
//! percent-encoded, so an id that holds `/`, `?`, `#` or `%` names nothing
//! but itself — never another route reached with the caller's credential.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// Every byte but RFC 3986's unreserved ones: letters, digits, `-`, `.`, `_`, `~`.
const NOT_UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// An id that no encoding makes a path segment of its own.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` cannot be an id in a URL's path")]
pub struct NotASegment(pub String);

/// `id` as one segment of a URL's path, percent-encoded. Refused: the empty
/// id, and `.` and `..`, which a URL parser (reqwest's too) reads as "here"
/// and "one up" however they are encoded.
pub fn segment(id: &str) -> Result<String, NotASegment> {
    if matches!(id, "" | "." | "..") {
        return Err(NotASegment(id.to_owned()));
    }
    Ok(utf8_percent_encode(id, NOT_UNRESERVED).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The path a URL parser makes of `/v1/rollouts/{id}/cancel`.
    fn parsed_path(id: &str) -> String {
        let url = format!("http://controller.test/v1/rollouts/{}/cancel", segment(id).unwrap());
        reqwest::Url::parse(&url).unwrap().path().to_owned()
    }

    #[test]
    fn an_id_in_a_url_is_one_encoded_path_segment_whatever_it_holds() {
        assert_eq!(
            segment("ro_01a2b3").unwrap(),
            "ro_01a2b3",
            "an id of its form reads as itself"
        );
        for id in [
            "x/../../admin/faults",
            "a?b=c#d",
            "%2e%2e",
            ".%2E",
            "a b",
            "é/\\",
            "...",
            "a/.",
        ] {
            let path = parsed_path(id);
            let segments: Vec<&str> = path.split('/').collect();
            assert_eq!(segments.len(), 5, "{id:?} stays one segment: {path}");
            assert_eq!(
                (segments[1], segments[2], segments[4]),
                ("v1", "rollouts", "cancel"),
                "{id:?}: {path}"
            );
            let decoded = percent_encoding::percent_decode_str(segments[3]).decode_utf8().unwrap();
            assert_eq!(decoded, id, "and decodes to the id itself");
        }
    }

    #[test]
    fn what_a_url_parser_reads_as_here_or_one_up_is_refused() {
        for id in ["", ".", ".."] {
            assert_eq!(segment(id), Err(NotASegment(id.to_owned())));
        }
    }
}
