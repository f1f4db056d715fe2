//! Reading the driver's metrics as Prometheus does: a plain HTTP/1.1 GET over a TCP stream, and
//! a parser for the text exposition format that maps a sample's name and label set to its value.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Only guards against a hung server; no test measures time.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    /// Names in lower case, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `GET path` on a fresh connection (closed by us after one request).
pub fn http_get(address: SocketAddr, path: &str) -> HttpResponse {
    let mut stream = TcpStream::connect_timeout(&address, HTTP_TIMEOUT)
        .unwrap_or_else(|e| panic!("connecting to {address}: {e}"));
    stream.set_read_timeout(Some(HTTP_TIMEOUT)).unwrap();
    stream.set_write_timeout(Some(HTTP_TIMEOUT)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    )
    .unwrap_or_else(|e| panic!("sending GET {path} to {address}: {e}"));
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .unwrap_or_else(|e| panic!("reading the answer to GET {path} from {address}: {e}"));
    parse_http_response(&raw).unwrap_or_else(|why| {
        panic!(
            "malformed answer to GET {path}: {why}:\n{}",
            String::from_utf8_lossy(&raw)
        )
    })
}

/// Parses a whole HTTP/1.x response: status, headers, body (by length, chunks or to the end).
pub fn parse_http_response(raw: &[u8]) -> Result<HttpResponse, String> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no end of headers")?;
    let head = std::str::from_utf8(&raw[..split]).map_err(|e| e.to_string())?;
    let payload = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or("no status line")?;
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(format!("status line {status_line:?}"));
    }
    let status = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("status line {status_line:?}"))?;
    let headers = lines
        .map(|line| {
            let (name, value) = line
                .split_once(':')
                .ok_or_else(|| format!("header line {line:?}"))?;
            Ok((name.trim().to_ascii_lowercase(), value.trim().to_string()))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mut response = HttpResponse {
        status,
        headers,
        body: String::new(),
    };
    let body = if response
        .header("transfer-encoding")
        .is_some_and(|te| te.eq_ignore_ascii_case("chunked"))
    {
        dechunk(payload)?
    } else if let Some(length) = response.header("content-length") {
        let length: usize = length
            .parse()
            .map_err(|_| format!("content-length {length:?}"))?;
        if payload.len() != length {
            return Err(format!(
                "content-length {length}, but {} bytes followed",
                payload.len()
            ));
        }
        payload.to_vec()
    } else {
        payload.to_vec()
    };
    response.body = String::from_utf8(body).map_err(|e| format!("body is not UTF-8: {e}"))?;
    Ok(response)
}

fn dechunk(mut payload: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let eol = payload
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("unterminated chunk size")?;
        let size_text = std::str::from_utf8(&payload[..eol]).map_err(|e| e.to_string())?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("chunk size {size_text:?}"))?;
        payload = &payload[eol + 2..];
        if size == 0 {
            return Ok(body);
        }
        if payload.len() < size + 2 || &payload[size..size + 2] != b"\r\n" {
            return Err("truncated chunk".into());
        }
        body.extend_from_slice(&payload[..size]);
        payload = &payload[size + 2..];
    }
}

/// One sample line: `name{label="value",...} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed text exposition (Prometheus 0.0.4 or OpenMetrics).
#[derive(Debug, Clone, Default)]
pub struct Exposition {
    pub samples: Vec<Sample>,
    /// Metric family → type, from `# TYPE` lines.
    pub types: HashMap<String, String>,
    /// Whether the text ended with OpenMetrics' `# EOF`.
    pub has_eof: bool,
}

impl Exposition {
    /// Parses `text`; panics, naming the line, on anything malformed or on a sample that
    /// appears twice.
    pub fn parse(text: &str) -> Exposition {
        let mut exposition = Exposition::default();
        let mut seen = std::collections::HashSet::new();
        for (number, line) in text.lines().enumerate() {
            let fail = |why: &str| -> ! {
                panic!("exposition line {}: {why}: {line:?}\n{text}", number + 1)
            };
            if exposition.has_eof {
                fail("text after # EOF");
            }
            if line.is_empty() {
                continue;
            }
            if let Some(comment) = line.strip_prefix('#') {
                let mut words = comment.split_whitespace();
                match words.next() {
                    Some("EOF") => exposition.has_eof = true,
                    Some("TYPE") => {
                        let (Some(family), Some(kind)) = (words.next(), words.next()) else {
                            fail("incomplete # TYPE")
                        };
                        exposition.types.insert(family.into(), kind.into());
                    }
                    _ => {} // HELP, UNIT, other comments
                }
                continue;
            }
            let sample = parse_sample(line).unwrap_or_else(|why| fail(&why));
            if !seen.insert((sample.name.clone(), sample.labels.clone())) {
                fail("sample appears twice");
            }
            exposition.samples.push(sample);
        }
        exposition
    }

    /// The value of the sample with exactly this name and label set.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let wanted: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels == wanted)
            .map(|s| s.value)
    }

    /// [`Exposition::get`] for a sample that must exist.
    #[track_caller]
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).unwrap_or_else(|| {
            panic!(
                "no sample {name} with labels {labels:?}; samples of that name: {:?}",
                self.named(name).collect::<Vec<_>>()
            )
        })
    }

    /// Every sample called `name`.
    pub fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(['{', ' '])
        .ok_or("no value after the metric name")?;
    let name = &line[..name_end];
    let valid_name = name.chars().enumerate().all(|(i, c)| {
        c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
    });
    if name.is_empty() || !valid_name {
        return Err(format!("bad metric name {name:?}"));
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(after_brace) = rest.strip_prefix('{') {
        rest = after_brace;
        loop {
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let eq = rest.find('=').ok_or("label without '='")?;
            let label = rest[..eq].trim();
            if label.is_empty() || !label.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("bad label name {label:?}"));
            }
            rest = rest[eq + 1..]
                .strip_prefix('"')
                .ok_or("label value not quoted")?;
            let mut value = String::new();
            let mut chars = rest.char_indices();
            let end = loop {
                match chars.next().ok_or("unterminated label value")? {
                    (i, '"') => break i,
                    (_, '\\') => match chars.next().ok_or("dangling escape")?.1 {
                        'n' => value.push('\n'),
                        c @ ('\\' | '"') => value.push(c),
                        c => return Err(format!("unknown escape \\{c}")),
                    },
                    (_, c) => value.push(c),
                }
            };
            if labels.insert(label.to_string(), value).is_some() {
                return Err(format!("label {label:?} given twice"));
            }
            rest = &rest[end + 1..];
            rest = rest.strip_prefix(',').unwrap_or(rest);
        }
    }
    let rest = rest.strip_prefix(' ').ok_or("no space before the value")?;
    let mut fields = rest.splitn(2, ' ');
    let value_text = fields.next().unwrap_or_default();
    let value: f64 = value_text
        .parse()
        .map_err(|_| format!("bad value {value_text:?}"))?;
    // What may follow: a timestamp, or an OpenMetrics exemplar.
    if let Some(tail) = fields.next()
        && !(tail.starts_with("# ") || tail.parse::<f64>().is_ok())
    {
        return Err(format!("unexpected {tail:?} after the value"));
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}
