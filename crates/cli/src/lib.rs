pub mod lambda;
pub mod ops;
pub mod stack;
