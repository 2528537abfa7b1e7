pub mod answer;
pub mod callback_url;
pub mod iam;
pub mod lambda;
pub mod load;
pub mod ops;
pub mod stack;
pub mod table;
