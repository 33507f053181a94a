//! The scheduler's progress display: a bar per running cell and one for the
//! run on a terminal, plain lines otherwise (CI logs, a service's log).

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Progress bars on a terminal; plain lines otherwise (CI logs).
pub struct Ui {
    multi: Option<MultiProgress>,
    /// The whole run: cells done and the estimated time left.
    run: Option<ProgressBar>,
}

impl Ui {
    pub fn new(interactive: bool) -> Self {
        let tty = interactive && std::io::stderr().is_terminal();
        let multi = tty.then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()));
        let run = multi.as_ref().map(|m| {
            let bar = m.add(ProgressBar::new(1));
            bar.set_style(
                ProgressStyle::with_template("{prefix:.bold} [{elapsed_precise}] {bar:25.green/white} {pos}/{len} cells {wide_msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.set_prefix("run");
            bar
        });
        Ui { multi, run }
    }

    pub fn overall(&self, done: usize, total: usize, left: Duration) {
        if let Some(bar) = &self.run {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
            bar.set_message(format!(
                "about {} left (estimated)",
                pgfleet_proto::workload::approx_seconds(left.as_secs_f64())
            ));
        }
    }

    /// A progress line for logs (a terminal shows the run bar instead).
    pub fn progress_line(&self, text: String) {
        if self.multi.is_none() {
            eprintln!("{text}");
        }
    }

    pub fn bar(&self, name: &str) -> ProgressBar {
        let Some(m) = &self.multi else {
            return ProgressBar::hidden();
        };
        let bar = m.add(ProgressBar::new(1));
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix:.bold} [{elapsed_precise}] {bar:25.cyan/blue} {pos}/{len} {wide_msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_prefix(name.to_string());
        bar.enable_steady_tick(Duration::from_millis(500));
        bar
    }

    /// Prints a line above the bars; whatever it quotes (a server's error,
    /// a submitted name) reaches the terminal escaped.
    pub fn line(&self, text: String) {
        let text = pgfleet_proto::escape::terminal(&text).into_owned();
        match &self.multi {
            Some(m) => {
                let _ = m.println(text);
            }
            None => eprintln!("{text}"),
        }
    }
}
