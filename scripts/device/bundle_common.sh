#!/usr/bin/env bash
# What build-bundle.sh and build-fuzz-bundle.sh both do (sourced, not run).

# copy_shared_libraries BINARY DIR: every shared library BINARY loads into DIR,
# except glibc's own and the CUDA driver (the GPU machine has those).
copy_shared_libraries() {
  ldd "$1" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|ld-linux*|libcuda.so*) ;;
      *) cp -L -n "$lib" "$2/" ;;
    esac
  done
}

# finish_bundle BUNDLE SOURCE_DIR ARCHIVE ARCHIVE_NAME: records the commit of
# SOURCE_DIR that was built and the bundle's size; with ARCHIVE = 1 (--archive)
# also writes .bundlez/ARCHIVE_NAME.tar.gz beside BUNDLE, the bundle compressed.
finish_bundle() {
  local bundle=$1 source=$2 archive=$3 name=$4
  local archives
  archives=$(dirname "$bundle")/.bundlez
  git -C "$source" rev-parse HEAD > "$bundle/COMMIT"
  du -sh "$bundle"
  if [ "$archive" = 1 ]; then
    mkdir -p "$archives"
    tar -czf "$archives/$name.tar.gz" -C "$bundle" .
    du -sh "$archives/$name.tar.gz"
  fi
}
