//! `uroce trace-merge A.json B.json -o BOTH.json`: the traces that
//! `UROCE_TRACE` wrote in several processes (both ends of a pair, each
//! with its own `pid` and the same `CLOCK_MONOTONIC` timestamps) as one
//! trace, which Perfetto's UI and chrome://tracing open in one go (each
//! opens one file). A file whose process died before closing it lacks
//! the array's `]`: it is read all the same, as the viewers read it.
//!
//! The merged trace is in the format's JSON Object Format
//! (`{"traceEvents": [...]}`), which every viewer reads as the array, and
//! VizTracer's `vizviewer` (which serves Perfetto's UI offline) too.

use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Why a merge failed.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// A file could not be read or written.
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    /// A file is not a trace (a JSON array of events, its `]` possibly
    /// missing).
    #[error("{0}: not a trace: {1}")]
    Format(PathBuf, String),
}

/// The events of one trace file.
pub fn read(path: &Path) -> Result<Vec<Value>, MergeError> {
    let text = std::fs::read_to_string(path).map_err(|e| MergeError::Io(path.into(), e))?;
    let t = text.trim_end();
    // A file cut off by a crash ends with a whole record and no `]`
    // (the writer writes whole records only).
    let whole = if t.ends_with(']') || !t.trim_start().starts_with('[') {
        t.to_string()
    } else {
        format!("{t}\n]")
    };
    match serde_json::from_str::<Value>(&whole) {
        Ok(Value::Array(v)) => Ok(v),
        Ok(Value::Object(mut o)) => match o.remove("traceEvents") {
            // The JSON Object Format holds the array under traceEvents.
            Some(Value::Array(v)) => Ok(v),
            _ => Err(MergeError::Format(
                path.into(),
                "no traceEvents array".into(),
            )),
        },
        Ok(_) => Err(MergeError::Format(path.into(), "not an array".into())),
        Err(e) => Err(MergeError::Format(path.into(), e.to_string())),
    }
}

/// Writes the events of `inputs`, in order, as one trace (the JSON
/// Object Format) to `out`; returns how many events it wrote.
pub fn run(inputs: &[PathBuf], out: &Path) -> Result<usize, MergeError> {
    let mut all = Vec::new();
    for p in inputs {
        all.extend(read(p)?);
    }
    let io = |e| MergeError::Io(out.into(), e);
    let f = std::fs::File::create(out).map_err(io)?;
    let mut w = std::io::BufWriter::new(f);
    w.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")
        .map_err(io)?;
    for (i, e) in all.iter().enumerate() {
        if i > 0 {
            w.write_all(b",\n").map_err(io)?;
        }
        serde_json::to_writer(&mut w, e).map_err(|e| MergeError::Io(out.into(), e.into()))?;
    }
    w.write_all(b"\n]}\n").map_err(io)?;
    w.flush().map_err(io)?;
    Ok(all.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_closed_and_cut_off_traces() {
        let dir = std::env::temp_dir().join(format!("uroce-merge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = dir.join("a.json");
        let b = dir.join("b.json");
        let out = dir.join("out.json");
        std::fs::write(
            &a,
            "[\n{\"pid\":1,\"ph\":\"i\",\"ts\":1.5,\"tid\":7,\"name\":\"x\"}\n]\n",
        )
        .unwrap();
        // Cut off by a crash: no `]`.
        std::fs::write(&b, "[\n{\"pid\":2,\"ph\":\"i\",\"ts\":2,\"tid\":8,\"name\":\"y\"},\n{\"pid\":2,\"ph\":\"i\",\"ts\":3,\"tid\":8,\"name\":\"z\"}").unwrap();
        assert_eq!(run(&[a.clone(), b.clone()], &out).unwrap(), 3);
        let v = read(&out).unwrap();
        assert_eq!(v[2]["name"], "z");
        assert_eq!(
            run(std::slice::from_ref(&out), &dir.join("again.json")).unwrap(),
            3
        );
        std::fs::write(&b, "{\"pid\":2").unwrap();
        assert!(matches!(run(&[a, b], &out), Err(MergeError::Format(..))));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
