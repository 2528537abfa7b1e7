//! Nothing but feature unification: see this crate's `Cargo.toml`.
