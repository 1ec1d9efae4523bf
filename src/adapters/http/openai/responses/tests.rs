//! Tests of the Responses translators.
