//! `keel rknpu gen FIXTURE_DIR OUT_DIR` and the rknpu parts of `keel probe`
//! (`--device rknpu [--dump-regcmd FILE]`). The lead ports the dispatch to clap; the logic
//! stays here.

use super::args::Args;
use crate::device::rknpu::{conv, fixture, regcmd};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// A device that is not there: `keel` exits with status 2 and this message.
#[derive(Debug)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unavailable {}

/// The accel node (`KEEL_RKNPU_NODE` overrides it, for tests).
pub fn node() -> PathBuf {
    std::env::var_os("KEEL_RKNPU_NODE").map_or_else(|| PathBuf::from("/dev/accel/accel0"), PathBuf::from)
}

/// `keel rknpu SUBCOMMAND`.
pub fn main(mut a: Args) -> Result<()> {
    let pos = a.positionals();
    a.finish()?;
    match pos.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["gen", fx, out] => {
            let written = fixture::gen(Path::new(fx), Path::new(out))?;
            for p in written {
                println!("{}", p.display());
            }
            Ok(())
        }
        ["gen", ..] => bail!("usage: keel rknpu gen FIXTURE_DIR OUT_DIR (a rocket-capture fixture folder: manifest.json, weights.bin, bias.bin, input.bin)"),
        _ => bail!("usage: keel rknpu gen FIXTURE_DIR OUT_DIR"),
    }
}

/// `keel probe --device rknpu [--dump-regcmd FILE]`.
pub fn probe(dump: Option<String>) -> Result<()> {
    if let Some(f) = dump {
        let bytes = std::fs::read(&f).with_context(|| format!("cannot read regcmd file {f}"))?;
        let s = regcmd::from_bytes(&bytes).map_err(|e| anyhow::anyhow!("{f}: {e}"))?;
        print!("{}", regcmd::listing(&s));
        match conv::decode(&s) {
            Ok(t) => println!("decoded: 1x1 convolution task {t:?}"),
            Err(e) => println!("not a keel/Mesa 1x1 convolution task: {e}"),
        }
        return Ok(());
    }
    let n = node();
    if !n.exists() {
        return Err(Unavailable(format!(
            "rknpu: {} not found. The RK3588 NPU needs Linux 6.18 or newer with CONFIG_DRM_ACCEL_ROCKET (module 'rocket'), \
             the device tree's NPU nodes enabled (compatible \"rockchip,rk3588-rknn-core\", three cores, with their IOMMUs and \
             power domain; many boards ship them disabled: enable them in the board's .dts or an overlay), and read/write \
             access to the node (group 'render' or a udev rule). Check `ls -l /dev/accel/` and `dmesg | grep -i rocket`.",
            n.display()
        ))
        .into());
    }
    bail!("rknpu: {} exists, but keel's rocket submission path has not been written yet (command streams only; not yet run on hardware)", n.display())
}
