//! Which workflows and agents files `sasctl` reads, and saying so. A command that needs them reads
//! them when it runs, in this order:
//! 1. the file its option names (`--workflows FILE`, `--agents FILE`);
//! 2. the file the environment names (`SAS_WORKFLOWS_FILE`, `SAS_AGENTS_FILE`, as the functions
//!    and the local runner read it);
//! 3. `config/workflows.json` or `config/agents.json` of the checkout `sasctl` is run in (the
//!    current directory or one above it holding `template.yaml` and `config/`): the files a user
//!    edits;
//! 4. only then the copy compiled into `sasctl` (the checkout's `config/` as it was when `sasctl`
//!    was built), named as such, so that a stale copy is never taken for the files on disk.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::Context;

/// Where a configuration file was read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The command's option (`--workflows`, `--agents`).
    Option(PathBuf),
    /// The environment variable named.
    Env(&'static str, PathBuf),
    /// The checkout's `config/` file.
    Checkout(PathBuf),
    /// The copy compiled into `sasctl`.
    BuiltIn,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Option(p) | Source::Checkout(p) => write!(f, "{}", p.display()),
            Source::Env(var, p) => write!(f, "{} (named by {var})", p.display()),
            Source::BuiltIn => f.write_str("the copy built into sasctl (config/ as it was when sasctl was built)"),
        }
    }
}

/// A configuration file's text and where it came from.
#[derive(Clone, Debug)]
pub struct Read {
    pub text: String,
    pub from: Source,
}

/// Which file: its option's name, its environment variable, its name in `config/`, the built-in copy.
#[derive(Clone, Copy, Debug)]
pub struct Kind {
    pub env: &'static str,
    pub file: &'static str,
    pub built_in: &'static str,
}

pub const WORKFLOWS: Kind =
    Kind { env: "SAS_WORKFLOWS_FILE", file: "workflows.json", built_in: sas_protocol::workflow::BUILT_IN_WORKFLOWS };
pub const AGENTS: Kind =
    Kind { env: "SAS_AGENTS_FILE", file: "agents.json", built_in: sas_core::agent::BUILT_IN_AGENTS };

/// The workflows file, read now (see the module's order).
pub fn workflows(option: Option<&Path>) -> anyhow::Result<Read> {
    read(WORKFLOWS, option, &std::env::current_dir().unwrap_or_default(), &|k| std::env::var(k).ok())
}

/// The agents file, read now (see the module's order).
pub fn agents(option: Option<&Path>) -> anyhow::Result<Read> {
    read(AGENTS, option, &std::env::current_dir().unwrap_or_default(), &|k| std::env::var(k).ok())
}

/// `kind`'s file as seen from `cwd` with the environment `env`.
pub fn read(
    kind: Kind,
    option: Option<&Path>,
    cwd: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Read> {
    let from = if let Some(p) = option {
        Source::Option(p.to_path_buf())
    } else if let Some(p) = env(kind.env).filter(|p| !p.is_empty()) {
        Source::Env(kind.env, PathBuf::from(p))
    } else if let Some(p) = checkout_file(cwd, kind.file) {
        Source::Checkout(p)
    } else {
        return Ok(Read { text: kind.built_in.to_owned(), from: Source::BuiltIn });
    };
    let path = match &from {
        Source::Option(p) | Source::Env(_, p) | Source::Checkout(p) => p,
        Source::BuiltIn => unreachable!("returned above"),
    };
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {from}"))?;
    Ok(Read { text, from })
}

/// `config/FILE` of the checkout holding `cwd`: the nearest of `cwd` and its parents that has
/// `template.yaml` and `config/FILE` (a `config/` of something else is not taken for ours).
fn checkout_file(cwd: &Path, file: &str) -> Option<PathBuf> {
    cwd.ancestors()
        .find(|d| d.join("template.yaml").is_file() && d.join("config").join(file).is_file())
        .map(|d| d.join("config").join(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sas-config-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("config")).unwrap();
        d
    }

    #[test]
    fn the_option_then_the_environment_then_the_checkout_then_the_built_in_copy() {
        let root = dir("order");
        std::fs::write(root.join("template.yaml"), "").unwrap();
        std::fs::write(root.join("config/workflows.json"), "checkout").unwrap();
        std::fs::write(root.join("mine.json"), "mine").unwrap();
        std::fs::write(root.join("env.json"), "env").unwrap();
        let deep = root.join("a/b");
        std::fs::create_dir_all(&deep).unwrap();
        let env_set = |k: &str| (k == "SAS_WORKFLOWS_FILE").then(|| root.join("env.json").display().to_string());
        let no_env = |_: &str| None;

        let r = read(WORKFLOWS, Some(&root.join("mine.json")), &deep, &env_set).unwrap();
        assert_eq!((r.text.as_str(), r.from.clone()), ("mine", Source::Option(root.join("mine.json"))));
        let r = read(WORKFLOWS, None, &deep, &env_set).unwrap();
        assert_eq!(r.text, "env");
        assert!(r.from.to_string().ends_with("env.json (named by SAS_WORKFLOWS_FILE)"), "{}", r.from);
        // from a directory below the checkout: the files the user edits, not the built-in copy
        let r = read(WORKFLOWS, None, &deep, &no_env).unwrap();
        assert_eq!(
            (r.text.as_str(), r.from.clone()),
            ("checkout", Source::Checkout(root.join("config/workflows.json")))
        );
        // no agents file in this checkout, and a config/ without template.yaml is not a checkout
        let r = read(AGENTS, None, &deep, &no_env).unwrap();
        assert_eq!(r.from, Source::BuiltIn);
        assert_eq!(r.text, sas_core::agent::BUILT_IN_AGENTS);
        assert!(r.from.to_string().contains("built into sasctl"), "{}", r.from);
        let other = dir("other");
        std::fs::write(other.join("config/workflows.json"), "not ours").unwrap();
        assert_eq!(read(WORKFLOWS, None, &other, &no_env).unwrap().from, Source::BuiltIn);
        // a file named that cannot be read is an error naming it, never the built-in copy instead
        let e = read(WORKFLOWS, Some(&root.join("missing.json")), &deep, &no_env).unwrap_err();
        assert!(format!("{e:#}").contains("missing.json"), "{e:#}");
        let _ = std::fs::remove_dir_all(&root);
        let _ = std::fs::remove_dir_all(&other);
    }
}
