{
  description = "ALE Robotics: a benchmark for coding agents that reproduce robotics papers";

  # nixos-24.11, pinned by flake.lock. Its rev and narHash are copied from a public lock file that
  # pins the same revision (docs/images.md, "The Nix flake", names it); `nix flake update` is the
  # way to move the pin, never an edited hash.
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-24.11";

  outputs = { self, nixpkgs }:
    let
      systems = [ "x86_64-linux" ];
      forAllSystems = f: builtins.listToAttrs (map (system: { name = system; value = f system; }) systems);

      # --- what images/ defines: builtins only, so `nix eval .#lib...` works without nixpkgs ---
      snapshotUrl = "https://snapshot.debian.org/archive";
      tomlFiles = dir: builtins.filter (n: builtins.match ".*\\.toml" n != null)
        (builtins.attrNames (builtins.readDir dir));
      definitions = builtins.listToAttrs (map
        (file:
          let d = builtins.fromTOML (builtins.readFile (./images + "/${file}"));
          in { name = d.name; value = d; })
        (tomlFiles ./images));
      aleEnvironment = builtins.fromTOML (builtins.readFile ./images/env/ale.toml);
      # Where a pinned .deb comes from: its mirror, then snapshot.debian.org (ale.images.build.deb_urls).
      debUrls = d: p: [
        "${d.debian.archives.${p.archive}}/${p.path}"
        "${snapshotUrl}/${p.archive}/${d.debian.snapshot}/${p.path}"
      ];
      # The document `ale images show` prints for a definition (ale.images.attest.describe);
      # tests/test_flake.py holds the two equal.
      describe = d: {
        name = d.name;
        user = "${toString d.image.user.uid}:${toString d.image.user.gid}";
        entrypoint = d.image.entrypoint or [ ];
        cmd = d.image.cmd or [ ];
        workdir = d.image.workdir;
        env = d.image.env or { };
        debs = map (p: { name = p.name; sha256 = p.sha256; urls = debUrls d p; }) d.debian.packages;
        wheels = map (w: { name = w.name; sha256 = w.sha256; url = w.url; }) d.python.wheels;
        project = { files = d.project.files; rename = d.project.rename or { }; };
        texts = (d.files or { }).text or { };
        snapshot_url = snapshotUrl;
      };

      perSystem = system:
        let
          pkgs = nixpkgs.legacyPackages.${system};
          inherit (pkgs) lib;
          python = pkgs.python311;

          # Every pinned download of an image in one folder laid out as the builder's cache
          # (sha256/<hex>), each fetched by Nix with the hash the definition pins.
          downloads = name:
            let d = definitions.${name};
            in pkgs.linkFarm "ale-image-${name}-downloads"
              (map (p: { name = "sha256/${p.sha256}"; path = pkgs.fetchurl { urls = debUrls d p; sha256 = p.sha256; name = "${p.name}.deb"; }; })
                d.debian.packages
              ++ map (w: { name = "sha256/${w.sha256}"; path = pkgs.fetchurl { url = w.url; sha256 = w.sha256; name = baseNameOf w.url; }; })
                d.python.wheels);

          # An image, built by the project's own layout writer (ale.images, standard library only)
          # from the same definition and the same downloads as `ale images build`: the same bytes,
          # the same manifest digest as a build on any other machine. $out is the OCI layout.
          image = name: pkgs.runCommand "ale-image-${name}" { nativeBuildInputs = [ python ]; } ''
            export PYTHONPATH=${self} PYTHONDONTWRITEBYTECODE=1 SOURCE_DATE_EPOCH=0
            python3 -m ale.images build ${name} --source ${self} --out "$TMPDIR/layouts" \
              --cache ${downloads name} --offline --epoch 0 > "$TMPDIR/printed"
            mv "$TMPDIR/layouts/${name}" "$out"
            cut -d' ' -f2 "$TMPDIR/printed" > "$out/digest"
          '';

          # pyrage from its source release: nixpkgs has no pyrage. The crates are fetched by the
          # checksums of the release's own Cargo.lock (a copy in images/env/).
          pyrageSource = aleEnvironment.from_source.pyrage;
          pyrage = python.pkgs.buildPythonPackage {
            pname = "pyrage";
            version = pyrageSource.version;
            pyproject = true;
            src = pkgs.fetchurl { url = pyrageSource.url; sha256 = pyrageSource.sha256; };
            cargoDeps = pkgs.rustPlatform.importCargoLock { lockFile = ./images/env + "/${pyrageSource.cargo_lock}"; };
            nativeBuildInputs = [ pkgs.rustPlatform.cargoSetupHook pkgs.rustPlatform.maturinBuildHook ];
            pythonImportsCheck = [ "pyrage" ];
          };

          # The project's other distributions: the hash-pinned wheels of images/env/ale.toml,
          # installed with nixpkgs' pip and their binaries' library paths fixed by autoPatchelf.
          wheelFiles = map (w: pkgs.fetchurl { url = w.url; sha256 = w.sha256; name = baseNameOf w.url; })
            (builtins.filter (w: !(aleEnvironment.from_source ? ${w.name})) aleEnvironment.python.wheels);
          wheels = pkgs.stdenv.mkDerivation {
            name = "ale-wheels";
            dontUnpack = true;
            nativeBuildInputs = [ python python.pkgs.pip pkgs.autoPatchelfHook ];
            buildInputs = [ pkgs.stdenv.cc.cc.lib pkgs.zlib pkgs.libGL pkgs.xorg.libX11 ];
            # MuJoCo's and glfw's rendering libraries (EGL, Wayland, X11 extensions): nothing here
            # renders, and the evaluator never opens a window.
            autoPatchelfIgnoreMissingDeps = true;
            installPhase = ''
              ${python.interpreter} -m pip install --no-deps --no-index --no-cache-dir --no-compile \
                --prefix "$out" ${lib.concatStringsSep " " wheelFiles}
            '';
          };

          ale = python.pkgs.buildPythonApplication {
            pname = "ale-robotics";
            version = "0.1.0";
            pyproject = true;
            src = self;
            build-system = [ python.pkgs.setuptools python.pkgs.wheel ];
            dependencies = [ pyrage ];
            dontCheckRuntimeDeps = true; # the wheels are on the wrapper's path, not inputs
            makeWrapperArgs = [
              "--prefix PYTHONPATH : ${wheels}/${python.sitePackages}"
              "--prefix PATH : ${lib.makeBinPath [ pkgs.bubblewrap pkgs.age pkgs.zstd ]}"
              "--prefix LD_LIBRARY_PATH : ${lib.makeLibraryPath [ pkgs.libseccomp ]}"
            ];
            doCheck = false;
            meta.mainProgram = "ale";
          };

          # Two builds of one image in two fresh folders inside one derivation: the same digest.
          reproducible = name: pkgs.runCommand "ale-image-${name}-reproducible" { nativeBuildInputs = [ python ]; } ''
            export PYTHONPATH=${self} PYTHONDONTWRITEBYTECODE=1
            for run in one two; do
              python3 -m ale.images build ${name} --source ${self} --out "$TMPDIR/$run" \
                --cache ${downloads name} --offline --epoch 0 | cut -d' ' -f2 > "$TMPDIR/$run.digest"
            done
            cmp "$TMPDIR/one.digest" "$TMPDIR/two.digest"
            cp "$TMPDIR/one.digest" "$out"
          '';
        in
        {
          packages = {
            inherit ale pyrage;
            default = ale;
            evaluator-image = image "evaluator";
            agent-base-image = image "agent-base";
            verifier-image = image "verifier";
            # the pinned downloads alone (nix build .#evaluator-downloads fetches them)
            evaluator-downloads = downloads "evaluator";
            agent-base-downloads = downloads "agent-base";
            verifier-downloads = downloads "verifier";
          };
          apps = rec {
            ale = { type = "app"; program = "${self.packages.${system}.ale}/bin/ale"; };
            default = ale;
          };
          devShells.default = pkgs.mkShell {
            packages = [ python pkgs.bubblewrap pkgs.libseccomp pkgs.age pkgs.zstd pkgs.git pkgs.skopeo pkgs.podman ];
            shellHook = ''
              # The project's dev environment, as on any machine: .venv from pyproject.toml (make install).
              export LD_LIBRARY_PATH=${lib.makeLibraryPath [ pkgs.libseccomp pkgs.stdenv.cc.cc.lib pkgs.zlib ]}
            '';
          };
          checks = {
            evaluator-image-reproducible = reproducible "evaluator";
            agent-base-image-reproducible = reproducible "agent-base";
            verifier-image-reproducible = reproducible "verifier";
            ale-runs = pkgs.runCommand "ale-runs" { } ''
              ${ale}/bin/ale --version > "$out"
              ${ale}/bin/ale tasks >> "$out"
            '';
          };
        };
      bySystem = forAllSystems perSystem;
    in
    {
      lib = {
        inherit definitions;
        imageDescriptions = builtins.mapAttrs (_: describe) definitions;
      };
      packages = builtins.mapAttrs (_: s: s.packages) bySystem;
      apps = builtins.mapAttrs (_: s: s.apps) bySystem;
      devShells = builtins.mapAttrs (_: s: s.devShells) bySystem;
      checks = builtins.mapAttrs (_: s: s.checks) bySystem;
    };
}
