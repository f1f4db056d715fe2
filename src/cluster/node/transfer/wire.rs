//! What the two ends of a transfer say inside the TLS channel, before the export stream: the
//! puller's ask (one JSON line: which PV and volume, and its token), the source's answer (one
//! JSON line: refused and why, or not), then, if not refused, the volume's export stream
//! (`host::archive`: checksummed end to end) until the source closes.

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The audience of the tokens a puller presents: a token kubelet projects for this audience only,
/// so one taken from a transfer is good for no other API.
pub const AUDIENCE: &str = "stickyvol.csi.io/transfer";

/// A line longer than this is refused (a token is a few KiB).
const MAX_LINE: u64 = 64 * 1024;

/// What the puller asks for.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Ask {
    /// The source volume's PV, whose `stickyvol.csi.io/move-to` must name the puller's node.
    pub pv: String,
    /// The source volume's id (the PV's volumeHandle).
    pub volume: String,
    /// The puller's ServiceAccount token, bound to its pod (so to its node), for `AUDIENCE`.
    pub token: String,
}

/// Never prints the token.
impl fmt::Debug for Ask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ask")
            .field("pv", &self.pv)
            .field("volume", &self.volume)
            .finish_non_exhaustive()
    }
}

/// The source's answer: the stream follows when `refused` is None.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Answer {
    pub refused: Option<String>,
}

/// Writes `value` as one JSON line.
pub async fn write_line<T: Serialize>(
    out: &mut (impl AsyncWrite + Unpin),
    value: &T,
) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    line.push(b'\n');
    out.write_all(&line).await?;
    out.flush().await
}

/// Reads one JSON line of at most `MAX_LINE` bytes.
pub async fn read_line<T: DeserializeOwned>(
    input: &mut (impl AsyncBufRead + Unpin),
) -> std::io::Result<T> {
    let mut line = Vec::new();
    input.take(MAX_LINE).read_until(b'\n', &mut line).await?;
    if line.last() != Some(&b'\n') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the peer's line ended early or ran past 64 KiB",
        ));
    }
    serde_json::from_slice(&line).map_err(|err| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not a transfer message: {err}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_round_trip_and_a_long_or_cut_line_is_refused() {
        let ask = Ask {
            pv: "pvc-1".into(),
            volume: "sv-1".into(),
            token: "secret-token".into(),
        };
        let mut buffer = Vec::new();
        write_line(&mut buffer, &ask).await.unwrap();
        let read: Ask = read_line(&mut buffer.as_slice()).await.unwrap();
        assert_eq!(read, ask);
        assert!(
            !format!("{ask:?}").contains("secret-token"),
            "the token is never printed"
        );
        let long = vec![b'x'; 70 * 1024];
        assert!(read_line::<Ask>(&mut long.as_slice()).await.is_err());
        let cut = &buffer[..buffer.len() - 1];
        assert!(read_line::<Ask>(&mut &cut[..]).await.is_err());
    }
}
