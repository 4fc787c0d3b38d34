#!/usr/bin/env bash
# Kiln as a dependency: installs this build into a temporary prefix (cmake --install), then builds
# and runs examples/consumer against the install tree three ways:
#   1. CMake, find_package(kiln 0.2 CONFIG REQUIRED), the shared library (kiln::kiln);
#   2. CMake, COMPONENTS static (kiln::kiln_static), its private dependencies found by the package;
#   3. pkg-config (kiln.pc), the shared library.
# It also checks the shared library's SONAME and that a request for an incompatible version fails.
#   test_consumer.sh BUILD_DIR SOURCE_DIR VERSION
set -euo pipefail
build=$1 src=$2 version=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
export KILN_CACHE_DIR=$tmp/cache
step() { printf '== %s\n' "$*"; }

step "cmake --install into $prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(cd "$prefix" && ls -d lib*/libkiln.so | head -1 | xargs dirname)
soname=$(readelf -d "$prefix/$libdir/libkiln.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ $soname == "libkiln.so.${version%.*}" ]] || { echo "SONAME is '$soname', expected libkiln.so.${version%.*}" >&2; exit 1; }
[[ -f $prefix/$libdir/libkiln.a && -f $prefix/include/kiln/version.h ]]

for kind in shared static; do
  step "find_package(kiln 0.2 CONFIG REQUIRED), $kind library"
  static=OFF; [[ $kind == static ]] && static=ON
  cmake -S "$src/examples/consumer" -B "$tmp/$kind" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix" -DKILN_CONSUMER_STATIC=$static >/dev/null
  cmake --build "$tmp/$kind" >/dev/null
  "$tmp/$kind/kiln_consumer" | tee "$tmp/out"
  grep -q "kiln headers $version, library $version" "$tmp/out"
  grep -q "cubin" "$tmp/out"
done

step "find_package(kiln 9.0) is refused"
mkdir -p "$tmp/v9"
printf 'cmake_minimum_required(VERSION 3.25)\nproject(v9 LANGUAGES CXX)\nfind_package(kiln 9.0 CONFIG REQUIRED)\n' > "$tmp/v9/CMakeLists.txt"
if cmake -S "$tmp/v9" -B "$tmp/v9/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null 2>&1; then
  echo "an incompatible version was accepted" >&2; exit 1
fi

step "pkg-config"
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
[[ $(pkg-config --modversion kiln) == "$version" ]]
c++ -std=c++20 "$src/examples/consumer/main.cpp" -o "$tmp/pc_consumer" $(pkg-config --cflags --libs kiln) \
  -Wl,-rpath,"$prefix/$libdir"
"$tmp/pc_consumer" | tee "$tmp/out"
grep -q "cubin" "$tmp/out"
echo "consumer: all ok"
