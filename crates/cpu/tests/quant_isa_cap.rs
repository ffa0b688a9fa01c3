//! `PAGEKV_DEV_ISA` parsing ([`IsaCap::from_lookup`]) and what each cap resolves to.

use pagekv_cpu::quant::{Isa, IsaCap, QuantError};

fn lookup(v: Option<&str>) -> impl Fn(&str) -> Option<String> + '_ {
    move |name| if name == "PAGEKV_DEV_ISA" { v.map(str::to_string) } else { None }
}

#[test]
fn isa_cap_parses_the_accepted_values() {
    assert_eq!(IsaCap::from_lookup(lookup(None)).unwrap(), IsaCap::Auto);
    for (text, cap) in
        [("scalar", IsaCap::Scalar), (" AVX2 ", IsaCap::Avx2), ("avx512", IsaCap::Avx512), ("auto", IsaCap::Auto)]
    {
        assert_eq!(IsaCap::from_lookup(lookup(Some(text))).unwrap(), cap, "{text:?}");
    }
}

#[test]
fn isa_cap_rejects_a_bad_value_naming_the_accepted_ones() {
    let e = IsaCap::from_lookup(lookup(Some("sse4"))).unwrap_err();
    assert!(matches!(e, QuantError::BadIsaCap { .. }));
    let msg = e.to_string();
    for word in ["PAGEKV_DEV_ISA", "sse4", "scalar", "avx2", "avx512", "auto"] {
        assert!(msg.contains(word), "{msg}");
    }
}

#[test]
fn isa_cap_resolves_within_the_cap_to_an_available_family() {
    assert_eq!(IsaCap::Scalar.best(), Isa::Scalar);
    let avx2 = IsaCap::Avx2.best();
    assert!(avx2 == Isa::Scalar || avx2 == Isa::Avx2);
    assert_eq!(avx2, if Isa::Avx2.is_available() { Isa::Avx2 } else { Isa::Scalar });
    let auto = IsaCap::Auto.best();
    assert!(auto.is_available());
    assert_eq!(auto, *Isa::available().last().unwrap());
    assert_eq!(IsaCap::Avx512.best(), auto);
}
