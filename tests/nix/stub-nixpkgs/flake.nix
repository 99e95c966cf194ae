{
  # A stand-in for nixpkgs, for checking the project's flake offline (nixpkgs cannot be
  # fetched here): `lib.genAttrs` and `lib.makeLibraryPath`, and per system the packages the
  # flake names as builtins-only derivations (`stdenv.cc.cc.lib` among them), `mkShell` (a
  # derivation that keeps its packages, shellHook and variables readable), `runCommand` and
  # `fetchurl`. Enough to evaluate every output (`nix flake show`, `nix flake
  # check --no-build`, `nix eval`); what builds (the lint check, `nix develop`) is
  # tests/nix/host-nixpkgs, a stand-in whose packages wrap this machine's tools.
  outputs =
    { self }:
    let
      names = [
        "python311" "uv" "ruff" "mypy" "gnumake" "git" "slurm" "munge" "apptainer" "podman"
        "debootstrap" "wrk" "nixfmt-rfc-style" "unzip" "zlib"
      ];
      packages =
        system:
        let
          stub = name: derivation {
            inherit name system;
            builder = "/bin/sh";
            args = [ "-c" "echo ${name} > $out" ];
          };
        in
        builtins.listToAttrs (map (name: { inherit name; value = stub name; }) names)
        // {
          stdenv = stub "stdenv" // { cc.cc.lib = stub "gcc-lib"; };
          fetchurl = { url, sha256 }: stub (baseNameOf url) // { inherit url sha256; };
          mkShell =
            { name, packages, shellHook, ... }@attrs:
            derivation {
              inherit name system;
              builder = "/bin/sh";
              args = [ "-c" "echo shell > $out" ];
            }
            // attrs
            // {
              packageNames = map (p: p.name) packages;
            };
          runCommand =
            name: env: script:
            derivation {
              inherit name system;
              builder = "/bin/sh";
              args = [ "-c" script ];
            }
            // env;
        };
    in
    {
      lib.genAttrs = names: f: builtins.listToAttrs (map (name: { inherit name; value = f name; }) names);
      lib.makeLibraryPath = packages: builtins.concatStringsSep ":" (map (p: "${p}/lib") packages);
      legacyPackages = {
        x86_64-linux = packages "x86_64-linux";
        aarch64-linux = packages "aarch64-linux";
      };
    };
}
