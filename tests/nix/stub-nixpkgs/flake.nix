{
  # A stand-in for nixpkgs, for checking the project's flake offline (nixpkgs cannot be
  # fetched here): `lib.genAttrs`, and per system the packages the dev shell names as
  # builtins-only derivations, `mkShell` (a derivation that keeps its packages and shellHook
  # readable) and `runCommand`. Enough to evaluate every output (`nix flake show`, `nix flake
  # check --no-build`, `nix eval`); `nix develop` needs nixpkgs' real stdenv.
  outputs =
    { self }:
    let
      names = [
        "python311" "uv" "ruff" "mypy" "gnumake" "git" "slurm" "munge" "apptainer" "podman"
        "debootstrap" "wrk" "nixfmt-rfc-style"
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
          mkShell =
            { name, packages, shellHook, ... }:
            derivation {
              inherit name system;
              builder = "/bin/sh";
              args = [ "-c" "echo shell > $out" ];
            }
            // {
              inherit packages shellHook;
              packageNames = map (p: p.name) packages;
            };
          runCommand =
            name: env: script:
            derivation {
              inherit name system;
              builder = "/bin/sh";
              args = [ "-c" script ];
            };
        };
    in
    {
      lib.genAttrs = names: f: builtins.listToAttrs (map (name: { inherit name; value = f name; }) names);
      legacyPackages = {
        x86_64-linux = packages "x86_64-linux";
        aarch64-linux = packages "aarch64-linux";
      };
    };
}
