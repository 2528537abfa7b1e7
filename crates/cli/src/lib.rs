pub mod ops;
pub mod stack;
