//! The markdown the bench prints as it goes and writes into RESULTS.md.

use std::path::Path;

const BEGIN: &str = "<!-- writer_bench:begin (written by writer_bench; do not edit by hand) -->";
const END: &str = "<!-- writer_bench:end -->";

#[derive(Default)]
pub struct Report {
    md: String,
}

impl Report {
    /// Appends a line (also printed).
    pub fn line(&mut self, s: impl AsRef<str>) {
        println!("{}", s.as_ref());
        self.md.push_str(s.as_ref());
        self.md.push('\n');
    }

    /// A markdown table.
    pub fn table(&mut self, header: &[&str], rows: &[Vec<String>]) {
        self.line(format!("| {} |", header.join(" | ")));
        self.line(format!(
            "|{}|",
            header.iter().map(|_| "---").collect::<Vec<_>>().join("|")
        ));
        for r in rows {
            self.line(format!("| {} |", r.join(" | ")));
        }
        self.line("");
    }

    /// Replaces the bench's section of `file` (between its markers) with
    /// this report, keeping everything else; appends it if there is none.
    pub fn write_section(&self, file: &Path) -> std::io::Result<()> {
        let old = match std::fs::read_to_string(file) {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "# Benchmark results\n".into(),
            Err(e) => return Err(e),
        };
        let section = format!("{BEGIN}\n{}{END}", self.md);
        let new = match (old.find(BEGIN), old.find(END)) {
            (Some(b), Some(e)) if e > b => {
                format!("{}{section}{}", &old[..b], &old[e + END.len()..])
            }
            _ => format!("{}\n{section}\n", old.trim_end()),
        };
        let tmp = file.with_extension("md.tmp");
        std::fs::write(&tmp, new)?;
        std::fs::rename(&tmp, file)
    }
}

/// Output of a shell command, trimmed ("?" when it fails).
fn sh(cmd: &str) -> String {
    std::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "?".into())
}

/// Machine, date and commit lines for the report's head.
pub fn provenance(data_dir: &Path) -> Vec<String> {
    let cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2");
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = sh("awk '/MemTotal/ {printf \"%.0f GiB\", $2/1048576}' /proc/meminfo");
    let kernel = sh("uname -r");
    let disk = sh(&format!(
        "df -hT {} | awk 'NR==2 {{print $1\" (\"$2\")\"}}'",
        data_dir.display()
    ));
    let dirty = if sh("git status --porcelain --untracked-files=no") == "?" {
        ""
    } else {
        " (with uncommitted changes)"
    };
    vec![
        format!("- date: {}", sh("date -u '+%Y-%m-%d %H:%M UTC'")),
        format!("- commit: `{}`{dirty}", sh("git rev-parse --short HEAD")),
        format!("- machine: {cpu}, {cores} cores, {mem} RAM, Linux {kernel}"),
        format!("- data directory: {} on {disk}", data_dir.display()),
    ]
}
