//! Tests of the Messages translators.
